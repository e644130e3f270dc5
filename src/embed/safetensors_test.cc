#include "embed/safetensors.h"

#include <gtest/gtest.h>

#include "testing/embed_files.h"

namespace ferry::embed {
namespace {

using testing::OneTensorHeader;
using testing::Safetensors;

Result<SafetensorsHeader> Parse(const std::string& file) {
  return ParseSafetensors(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(file.data()), file.size()));
}

TEST(Safetensors, ParsesTensorsAndMetadata) {
  std::string header =
      "{\"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]},"
      " \"a\": {\"dtype\": \"BF16\", \"shape\": [3, 2], \"data_offsets\": [0, 12]},"
      " \"__metadata__\": {\"format\": \"pt\"}}   ";  // trailing spaces are allowed padding
  std::string file = Safetensors(header, std::string(20, 'x'));
  auto h = Parse(file);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->data_start, 8 + header.size());
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(h->tensors[0].dtype, "BF16");
  EXPECT_EQ(h->tensors[0].shape, (std::vector<uint64_t>{3, 2}));
  EXPECT_EQ(h->tensors[0].begin, h->data_start);
  EXPECT_EQ(h->tensors[0].end, h->data_start + 12);
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].element_bytes, 4u);
}

TEST(Safetensors, ScalarAndEmptyTensors) {
  auto h = Parse(
      Safetensors("{\"s\": {\"dtype\": \"U8\", \"shape\": [], \"data_offsets\": [0, 1]},"
                  " \"e\": {\"dtype\": \"F16\", \"shape\": [0, 4], \"data_offsets\": [1, 1]}}",
                  "z"));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors.size(), 2u);
}

TEST(Safetensors, RejectsMalformedHeaders) {
  const std::string data(16, 'd');
  auto tensor = [](const std::string& body) { return "{\"t\": {" + body + "}}"; };
  const std::string ok_body = "\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]";
  ASSERT_TRUE(Parse(Safetensors(tensor(ok_body), data)).ok());
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"short file", std::string("\x10\0\0", 3)},
      {"length 0", Safetensors("", data)},
      {"length 1", Safetensors("{", data)},
      {"length past end", std::string("\xff\0\0\0\0\0\0\0{}", 10)},
      {"length huge", std::string("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10)},
      {"not json", Safetensors("{nope", data)},
      {"not an object", Safetensors("[1, 2]", data)},
      {"leading space", Safetensors(" {}", data)},
      {"trailing garbage", Safetensors("{} x", data)},
      {"tensor not object", Safetensors("{\"t\": 3}", data)},
      {"empty name", Safetensors("{\"\": {" + ok_body + "}}", data)},
      {"unknown key", Safetensors(tensor(ok_body + ", \"x\": 1"), data)},
      {"missing dtype", Safetensors(tensor("\"shape\": [2, 4], \"data_offsets\": [0, 16]"), data)},
      {"unknown dtype",
       Safetensors(tensor("\"dtype\": \"BF17\", \"shape\": [2, 4], \"data_offsets\": [0, 16]"),
                   data)},
      {"dtype not string",
       Safetensors(tensor("\"dtype\": 2, \"shape\": [2, 4], \"data_offsets\": [0, 16]"), data)},
      {"negative dim",
       Safetensors(tensor("\"dtype\": \"BF16\", \"shape\": [-2, 4], \"data_offsets\": [0, 16]"),
                   data)},
      {"float dim",
       Safetensors(tensor("\"dtype\": \"BF16\", \"shape\": [2.0, 4], \"data_offsets\": [0, 16]"),
                   data)},
      {"shape not array",
       Safetensors(tensor("\"dtype\": \"BF16\", \"shape\": 8, \"data_offsets\": [0, 16]"), data)},
      {"rank 9",
       Safetensors(
           tensor("\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,16], \"data_offsets\": [0, 16]"),
           data)},
      {"size overflow",
       Safetensors(tensor("\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
                          "\"data_offsets\": [0, 16]"),
                   data)},
      {"size mismatch",
       Safetensors(tensor("\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 15]"),
                   data)},
      {"reversed offsets",
       Safetensors(tensor("\"dtype\": \"U8\", \"shape\": [0], \"data_offsets\": [16, 0]"), data)},
      {"past end of file",
       Safetensors(tensor("\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [8, 24]"),
                   data)},
      {"offsets not pair",
       Safetensors(tensor("\"dtype\": \"BF16\", \"shape\": [2, 4], \"data_offsets\": [0, 16, 3]"),
                   data)},
      {"offset too big for u64",
       Safetensors(tensor("\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0, "
                          "184467440737095516160]"),
                   data)},
      {"overlap",
       Safetensors("{\"a\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [0, 8]},"
                   " \"b\": {\"dtype\": \"U8\", \"shape\": [8], \"data_offsets\": [4, 12]}}",
                   data)},
      {"metadata not object", Safetensors("{\"__metadata__\": 3}", data)},
      {"metadata value not string", Safetensors("{\"__metadata__\": {\"k\": 3}}", data)},
      {"invalid utf-8", Safetensors("{\"\xff\": {" + ok_body + "}}", data)},
  };
  for (const auto& [what, file] : bad) {
    auto h = Parse(file);
    EXPECT_EQ(h.status().code(), Code::kInvalidArgument) << what;
  }
}

TEST(Safetensors, OneTensorHelperIsValid) {
  auto h = Parse(Safetensors(OneTensorHeader("w", "BF16", 3, 8, 48), std::string(48, 'q')));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->tensors[0].shape, (std::vector<uint64_t>{3, 8}));
}

}  // namespace
}  // namespace ferry::embed
