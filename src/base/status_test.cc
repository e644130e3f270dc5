#include "ferry/status.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return Status(Code::kInvalidArgument, "odd");
  return v / 2;
}

Result<int> Quarter(int v) {
  FERRY_ASSIGN_OR_RETURN(int half, Half(v));
  FERRY_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

Status Check(int v) {
  FERRY_RETURN_IF_ERROR(Half(v).status());
  return Status::Ok();
}

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Code::kOk);
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, CarriesCodeAndMessage) {
  Status s(Code::kOutOfRange, "offset 10 past 8");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.ToString(), "OUT_OF_RANGE: offset 10 past 8");
  EXPECT_EQ(s.WithContext("write").message(), "write: offset 10 past 8");
}

TEST(Status, OkCodeWithMessageIsOk) { EXPECT_TRUE(Status(Code::kOk, "ignored").ok()); }

TEST(Result, PropagatesValuesAndErrors) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), Code::kInvalidArgument);
  EXPECT_EQ(Check(3).code(), Code::kInvalidArgument);
  EXPECT_TRUE(Check(4).ok());
}

TEST(Result, FromOkStatusIsInternalError) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInternal);
}

TEST(Code, EveryCodeHasAName) {
  for (int c = 0; c <= static_cast<int>(Code::kInProgress); ++c)
    EXPECT_NE(CodeName(static_cast<Code>(c)), "UNKNOWN_CODE");
}

}  // namespace
}  // namespace ferry
