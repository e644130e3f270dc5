// The notification ring: the pure record functions (wrap-around, a full ring, records exactly
// at capacity, every malformed index and length) and the two ends over a real memory file.
#include "transport/shm/ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "transport/shm/ring_format.h"

namespace ferry::internal::shm {
namespace {

std::vector<std::byte> Ring(size_t capacity) { return std::vector<std::byte>(capacity, std::byte{0xee}); }

RingTake Take(const std::vector<std::byte>& ring, uint64_t tail, uint64_t head, size_t limit = 1 << 20,
              size_t max_records = SIZE_MAX) {
  return TakeRecords(std::span<const std::byte>(ring), tail, head, limit, max_records);
}

// Writes a 16-byte record header by hand, at `at` (no wrap).
void RawHeader(std::vector<std::byte>& ring, uint64_t at, uint32_t size, uint32_t flags, uint64_t token) {
  uint8_t h[16];
  for (int i = 0; i < 4; ++i) h[i] = static_cast<uint8_t>(size >> (8 * i));
  for (int i = 0; i < 4; ++i) h[4 + i] = static_cast<uint8_t>(flags >> (8 * i));
  for (int i = 0; i < 8; ++i) h[8 + i] = static_cast<uint8_t>(token >> (8 * i));
  std::memcpy(ring.data() + (at % ring.size()), h, 16);
}

TEST(ShmRing, RecordsRoundTripInOrder) {
  auto ring = Ring(256);
  uint64_t head = 0;
  PutRecord(ring, head, "first", 0, false);
  head += RecordSpan(5);
  PutRecord(ring, head, "", 0, false);
  head += RecordSpan(0);
  PutRecord(ring, head, "batch done", 77, true);
  head += RecordSpan(10);
  EXPECT_EQ(head, 24u + 16u + 32u);
  RingTake t = Take(ring, 0, head);
  ASSERT_TRUE(t.error.ok()) << t.error.ToString();
  ASSERT_EQ(t.records.size(), 3u);
  EXPECT_EQ(t.records[0].message, "first");
  EXPECT_FALSE(t.records[0].acked);
  EXPECT_EQ(t.records[1].message, "");
  EXPECT_EQ(t.records[2].message, "batch done");
  EXPECT_TRUE(t.records[2].acked);
  EXPECT_EQ(t.records[2].token, 77u);
  EXPECT_EQ(t.tail, head);
  // An empty range takes nothing; a limit on the count stops early at a record boundary.
  EXPECT_TRUE(Take(ring, head, head).records.empty());
  t = Take(ring, 0, head, 1 << 20, 2);
  EXPECT_TRUE(t.error.ok());
  EXPECT_EQ(t.records.size(), 2u);
  EXPECT_EQ(t.tail, RecordSpan(5) + RecordSpan(0));
}

TEST(ShmRing, RecordsWrapAroundTheEnd) {
  // Every size from 0 to 100 bytes, in a ring of 128: headers and messages straddle the end
  // at every offset, and the indices run far past the capacity.
  auto ring = Ring(128);
  std::mt19937 rng(3);
  uint64_t head = 0, tail = 0;
  for (int round = 0; round < 2000; ++round) {
    const size_t size = rng() % 97;
    std::string m(size, '\0');
    for (auto& c : m) c = static_cast<char>(rng());
    ASSERT_LE(RecordSpan(size), 128 - (head - tail));
    PutRecord(ring, head, m, round, round % 2 == 1);
    head += RecordSpan(size);
    RingTake t = Take(ring, tail, head);
    ASSERT_TRUE(t.error.ok()) << round << ": " << t.error.ToString();
    ASSERT_EQ(t.records.size(), 1u);
    EXPECT_EQ(t.records[0].message, m);
    EXPECT_EQ(t.records[0].acked, round % 2 == 1);
    EXPECT_EQ(t.records[0].token, round % 2 == 1 ? static_cast<uint64_t>(round) : 0u);
    tail = t.tail;
  }
  EXPECT_EQ(tail, head);
  EXPECT_GT(head, 128u * 100);
}

TEST(ShmRing, IndicesWrapAround64Bits) {
  auto ring = Ring(64);
  const uint64_t tail = UINT64_MAX - 15;  // 16 bytes before the indices wrap to 0
  PutRecord(ring, tail, "across 2^64", 0, false);
  const uint64_t head = tail + RecordSpan(11);  // wraps
  EXPECT_LT(head, tail);
  RingTake t = Take(ring, tail, head);
  ASSERT_TRUE(t.error.ok()) << t.error.ToString();
  ASSERT_EQ(t.records.size(), 1u);
  EXPECT_EQ(t.records[0].message, "across 2^64");
}

TEST(ShmRing, ARecordExactlyAtCapacity) {
  auto ring = Ring(64);
  const std::string m(48, 'z');  // 16 + 48 = the whole ring
  ASSERT_EQ(RecordSpan(m.size()), 64u);
  PutRecord(ring, 40, m, 0, false);  // starting near the end: wraps
  RingTake t = Take(ring, 40, 40 + 64);
  ASSERT_TRUE(t.error.ok()) << t.error.ToString();
  ASSERT_EQ(t.records.size(), 1u);
  EXPECT_EQ(t.records[0].message, m);
  // One byte more published than the ring holds is a violation, not a record.
  EXPECT_EQ(Take(ring, 40, 40 + 72).error.code(), Code::kDataLoss);
}

TEST(ShmRing, MalformedIndicesAreRejected) {
  auto ring = Ring(128);
  PutRecord(ring, 0, "ok", 0, false);
  auto code = [&](uint64_t tail, uint64_t head) { return Take(ring, tail, head).error.code(); };
  EXPECT_EQ(code(64, 56), Code::kDataLoss);           // the producer index behind the consumer's
  EXPECT_EQ(code(0, 136), Code::kDataLoss);           // more than the capacity ahead
  EXPECT_EQ(code(0, UINT64_MAX - 7), Code::kDataLoss);  // far ahead (or behind by 8)
  EXPECT_EQ(code(0, 12), Code::kDataLoss);            // not a multiple of 8
  EXPECT_EQ(code(0, 8), Code::kDataLoss);             // a header cut short
  EXPECT_EQ(code(0, 16), Code::kDataLoss);            // the message cut short
  EXPECT_EQ(code(4, 28), Code::kDataLoss);            // a consumer index off the grid
  EXPECT_EQ(code(0, 24), Code::kOk);
  // Rings that are no ring: not a power of two, too small, empty.
  std::vector<std::byte> odd(96), tiny(32), none;
  EXPECT_EQ(Take(odd, 0, 0).error.code(), Code::kDataLoss);
  EXPECT_EQ(Take(tiny, 0, 0).error.code(), Code::kDataLoss);
  EXPECT_EQ(Take(none, 0, 0).error.code(), Code::kDataLoss);
}

TEST(ShmRing, MalformedRecordsStopTheRingAfterTheGoodOnes) {
  auto ring = Ring(256);
  PutRecord(ring, 0, "good", 0, false);
  const uint64_t at = RecordSpan(4);
  struct Case {
    uint32_t size, flags;
    uint64_t token;
    uint64_t published;  // bytes published after the good record
  };
  const Case cases[] = {
      {200, 0, 0, 216},     // longer than the limit (100 below)
      {64, 0, 0, 64},       // runs past the producer index
      {0xffffffff, 0, 0, 200},  // a huge length
      {8, 2, 0, 24},        // an unknown flag
      {8, 0, 5, 24},        // a token on a record that asks for no answer
  };
  for (const Case& c : cases) {
    RawHeader(ring, at, c.size, c.flags, c.token);
    RingTake t = Take(ring, 0, at + c.published, 100);
    EXPECT_EQ(t.error.code(), Code::kDataLoss) << c.size << " " << c.flags;
    ASSERT_EQ(t.records.size(), 1u);
    EXPECT_EQ(t.records[0].message, "good");
    EXPECT_EQ(t.tail, at) << "the consumer index stops at the bad record";
  }
  // Exactly at the limit is fine.
  PutRecord(ring, at, std::string(100, 'l'), 0, false);
  RingTake t = Take(ring, 0, at + RecordSpan(100), 100);
  EXPECT_TRUE(t.error.ok()) << t.error.ToString();
  EXPECT_EQ(t.records.size(), 2u);
}

TEST(ShmRing, CapacityFromTheOptions) {
  EXPECT_EQ(RingCapacityFor(64 * 1024, 1 << 16), 256u << 10);
  EXPECT_EQ(RingCapacityFor(8, 2), 64u << 10);
  EXPECT_EQ(RingCapacityFor(1 << 20, 4), 4u << 20);
  EXPECT_EQ(RingCapacityFor(size_t{1} << 40, 4), kMaxRingBytes);
  EXPECT_EQ(RingMessageLimit(256 << 10, 64 << 10), 64u << 10);
  EXPECT_EQ(RingMessageLimit(kMaxRingBytes, size_t{1} << 40), kMaxRingBytes / 2 - 16);
}

// ---- The two ends over a memory file -----------------------------------------------------------

struct Pair {
  std::unique_ptr<RingReader> reader;
  std::unique_ptr<RingWriter> writer;
};

Pair MakePair(uint64_t capacity, size_t limit) {
  Pair p;
  auto r = RingReader::Create(capacity, limit);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return p;
  p.reader = std::move(r).value();
  auto w = RingWriter::Map(p.reader->fd(), p.reader->capacity(), p.reader->max_message_bytes());
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (w.ok()) p.writer = std::move(w).value();
  return p;
}

TEST(ShmRingEnds, FillDrainAndRefill) {
  Pair p = MakePair(64 << 10, 1000);
  ASSERT_TRUE(p.writer);
  EXPECT_EQ(p.writer->max_message_bytes(), 1000u);
  EXPECT_FALSE(p.reader->Pending());
  bool wake = false;
  const std::string m(1000, 'm');
  int put = 0;
  Status s;
  while ((s = p.writer->Put(m, 0, false, &wake)).ok()) ++put;
  EXPECT_EQ(s.code(), Code::kResourceExhausted);
  EXPECT_EQ(put, static_cast<int>((64 << 10) / RecordSpan(1000)));
  EXPECT_EQ(p.writer->Put(std::string(1001, 'x'), 0, false, &wake).code(), Code::kInvalidArgument);
  EXPECT_TRUE(p.reader->Pending());
  RingTake t = p.reader->Take(SIZE_MAX);
  ASSERT_TRUE(t.error.ok());
  EXPECT_EQ(t.records.size(), static_cast<size_t>(put));
  EXPECT_FALSE(p.reader->Pending());
  // The room the reader freed is the writer's again.
  ASSERT_TRUE(p.writer->Put("again", 9, true, &wake).ok());
  t = p.reader->Take(SIZE_MAX);
  ASSERT_EQ(t.records.size(), 1u);
  EXPECT_EQ(t.records[0].token, 9u);
}

TEST(ShmRingEnds, TheWriterWakesASleepingReaderOnce) {
  Pair p = MakePair(64 << 10, 100);
  ASSERT_TRUE(p.writer);
  bool wake = true;
  ASSERT_TRUE(p.writer->Put("a", 0, false, &wake).ok());
  EXPECT_FALSE(wake) << "the reader is awake";
  EXPECT_TRUE(p.reader->Arm()) << "a record is pending: the reader must not sleep";
  (void)p.reader->Take(SIZE_MAX);
  EXPECT_FALSE(p.reader->Arm());
  ASSERT_TRUE(p.writer->Put("b", 0, false, &wake).ok());
  EXPECT_TRUE(wake);
  ASSERT_TRUE(p.writer->Put("c", 0, false, &wake).ok());
  EXPECT_FALSE(wake) << "woken once per sleep";
  p.reader->Disarm();
  EXPECT_EQ(p.reader->Take(SIZE_MAX).records.size(), 2u);
}

TEST(ShmRingEnds, AScribblingWriterBreaksTheRing) {
  Pair p = MakePair(64 << 10, 100);
  ASSERT_TRUE(p.writer);
  bool wake = false;
  ASSERT_TRUE(p.writer->Put("before", 0, false, &wake).ok());
  // The peer moves the producer index beyond the ring, through its own mapping.
  void* m = mmap(nullptr, kRingControlBytes, PROT_READ | PROT_WRITE, MAP_SHARED, p.reader->fd(), 0);
  ASSERT_NE(m, MAP_FAILED);
  auto* head = reinterpret_cast<uint64_t*>(static_cast<std::byte*>(m) + kRingHeadOffset);
  *head += (64 << 10) + 8;
  RingTake t = p.reader->Take(SIZE_MAX);
  EXPECT_EQ(t.error.code(), Code::kDataLoss);
  EXPECT_TRUE(t.records.empty());
  EXPECT_TRUE(p.reader->broken());
  EXPECT_FALSE(p.reader->Pending());
  EXPECT_FALSE(p.reader->Arm());
  EXPECT_EQ(p.reader->Take(SIZE_MAX).error.code(), Code::kDataLoss);
  munmap(m, kRingControlBytes);
}

// The writer reads the consumer index only when the room it knows of runs short; then a
// corrupt one (ahead of the producer index, or gone back) breaks the ring for it, and it never
// writes outside the room it checked.
TEST(ShmRingEnds, AWriterRefusesACorruptConsumerIndex) {
  for (uint64_t corrupt : {uint64_t{1} << 40, uint64_t{8}}) {
    SCOPED_TRACE(corrupt);
    Pair p = MakePair(64 << 10, 1000);
    ASSERT_TRUE(p.writer);
    void* m = mmap(nullptr, kRingControlBytes, PROT_READ | PROT_WRITE, MAP_SHARED, p.reader->fd(), 0);
    ASSERT_NE(m, MAP_FAILED);
    auto* tail = reinterpret_cast<uint64_t*>(static_cast<std::byte*>(m) + kRingTailOffset);
    bool wake = false;
    const std::string big(1000, 'b');
    // Fill the ring, let the reader take all, fill again: the writer read the index then.
    Status s;
    while ((s = p.writer->Put(big, 0, false, &wake)).ok()) {
    }
    ASSERT_EQ(s.code(), Code::kResourceExhausted);
    ASSERT_TRUE(p.reader->Take(SIZE_MAX).error.ok());
    const uint64_t honest = *tail;
    ASSERT_TRUE(p.writer->Put(big, 0, false, &wake).ok());
    // Now the receiver lies: far ahead, or back behind what it said before.
    *tail = corrupt == 8 ? honest - 8 : corrupt;
    int put = 0;
    while ((s = p.writer->Put(big, 0, false, &wake)).ok()) ++put;
    EXPECT_EQ(s.code(), Code::kDataLoss) << s.ToString();
    EXPECT_LE(put, 64);
    *tail = honest;
    EXPECT_EQ(p.writer->Put("x", 0, false, &wake).code(), Code::kDataLoss) << "stays broken";
    munmap(m, kRingControlBytes);
  }
}

TEST(ShmRingEnds, MapChecksTheFile) {
  auto r = RingReader::Create(64 << 10, 100);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(RingWriter::Map((*r)->fd(), 128 << 10, 100).status().code(), Code::kInvalidArgument);  // size
  EXPECT_EQ(RingWriter::Map((*r)->fd(), 96 << 10, 100).status().code(), Code::kInvalidArgument);   // not 2^n
  EXPECT_EQ(RingWriter::Map((*r)->fd(), 64 << 10, 64 << 10).status().code(), Code::kInvalidArgument);  // limit
  int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, kRingControlBytes + (64 << 10)), 0);
  EXPECT_EQ(RingWriter::Map(unsealed, 64 << 10, 100).status().code(), Code::kInvalidArgument);
  close(unsealed);
  EXPECT_EQ(RingReader::Create(100, 10).status().code(), Code::kInvalidArgument);
}

}  // namespace
}  // namespace ferry::internal::shm
