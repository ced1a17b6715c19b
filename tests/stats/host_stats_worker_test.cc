// HostStatsWorker: results equal ComputeHostStats and come back in ticket order with
// their tags; a full worker refuses until results are released (it never blocks); the
// destructor finishes what was submitted. Run under TSan too.
#include "lockstep/agent/host_stats_worker.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../thread_names.h"

namespace lockstep {
namespace {

using testing::ThreadsNamed;

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void ExpectSameStats(const TensorStats& a, const TensorStats& b) {
  EXPECT_EQ(a.numel, b.numel);
  EXPECT_EQ(a.min, b.min);
  EXPECT_EQ(a.max, b.max);
  EXPECT_EQ(a.mean, b.mean);
  EXPECT_EQ(a.std, b.std);
  EXPECT_EQ(a.l2, b.l2);
  EXPECT_EQ(a.nan_count, b.nan_count);
  EXPECT_EQ(a.zero_count, b.zero_count);
  ASSERT_EQ(a.sketch_k, b.sketch_k);
  for (int i = 0; i < a.sketch_k; ++i) EXPECT_EQ(a.sketch[i], b.sketch[i]) << i;
  ASSERT_EQ(a.hist_bins, b.hist_bins);
  for (int i = 0; i < a.hist_bins; ++i) EXPECT_EQ(a.hist[i], b.hist[i]) << i;
}

std::unique_ptr<HostStatsWorker> StartWorker(uint32_t capacity) {
  auto w = HostStatsWorker::Start(StatsConfig{}, capacity);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(w).value() : nullptr;
}

TEST(HostStatsWorker, ResultsEqualTheInlineKernelInTicketOrderWithTheirTags) {
  auto w = StartWorker(16);
  ASSERT_NE(w, nullptr);
  std::vector<std::vector<float>> bufs;
  for (uint32_t i = 0; i < 10; ++i) bufs.push_back(Normal(1000 + 777 * i, i));
  for (uint32_t i = 0; i < bufs.size(); ++i) {
    HostStatsWorker::Tag tag{100 + i, i % 3, 7 * i, 2 * i};
    EXPECT_EQ(w->Submit(tag, bufs[i].data(), DType::kF32, bufs[i].size()), i);
  }
  EXPECT_EQ(w->Submitted(), bufs.size());
  w->WaitDone(bufs.size() - 1);
  ASSERT_EQ(w->Done(), bufs.size());
  for (uint32_t i = 0; i < bufs.size(); ++i) {
    HostStatsWorker::Tag tag;
    const TensorStats* got = w->Result(i, &tag);
    ASSERT_NE(got, nullptr) << i;
    EXPECT_EQ(tag.step, 100 + i);
    EXPECT_EQ(tag.micro, i % 3);
    EXPECT_EQ(tag.id, 7 * i);
    EXPECT_EQ(tag.order, 2 * i);
    TensorStats want;
    ASSERT_TRUE(ComputeHostStats(bufs[i].data(), DType::kF32, bufs[i].size(), StatsConfig{}, &want).ok());
    ExpectSameStats(*got, want);
  }
  w->Release(bufs.size());
  EXPECT_EQ(w->Result(0, nullptr), nullptr);  // released
}

TEST(HostStatsWorker, StridedViewsAreReadInPlaceLikeInline) {
  auto w = StartWorker(4);
  ASSERT_NE(w, nullptr);
  // A (64, 16, 128) buffer seen as (16, 64, 128): attention's permuted output.
  std::vector<float> buf = Normal(64 * 16 * 128, 9);
  const int64_t sizes[] = {16, 64, 128}, strides[] = {128, 2048, 1};
  HostLayout layout;
  ASSERT_TRUE(MakeHostLayout(sizes, strides, 3, &layout).ok());
  EXPECT_EQ(w->Submit(HostStatsWorker::Tag{3, 0, 1, 2}, buf.data(), DType::kF32, layout), 0u);
  w->WaitDone(0);
  const TensorStats* got = w->Result(0, nullptr);
  ASSERT_NE(got, nullptr);
  TensorStats want;
  ASSERT_TRUE(ComputeHostStatsStrided(buf.data(), DType::kF32, layout, StatsConfig{}, &want).ok());
  ExpectSameStats(*got, want);
  w->Release(1);
}

TEST(HostStatsWorker, HalfPrecisionInputs) {
  auto w = StartWorker(4);
  ASSERT_NE(w, nullptr);
  std::vector<uint16_t> bf16(5000);
  std::vector<float> src = Normal(bf16.size(), 9);
  for (size_t i = 0; i < src.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &src[i], 4);
    bf16[i] = static_cast<uint16_t>(bits >> 16);
  }
  uint64_t t = w->Submit({}, bf16.data(), DType::kBF16, bf16.size());
  ASSERT_EQ(t, 0u);
  w->WaitDone(t);
  TensorStats want;
  ASSERT_TRUE(ComputeHostStats(bf16.data(), DType::kBF16, bf16.size(), StatsConfig{}, &want).ok());
  const TensorStats* got = w->Result(t, nullptr);
  ASSERT_NE(got, nullptr);
  ExpectSameStats(*got, want);
}

TEST(HostStatsWorker, FullRefusesUntilReleasedInsteadOfBlocking) {
  std::vector<float> big = Normal(1 << 20, 1);  // outlives w, which may still read it
  auto w = StartWorker(2);
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), 0u);
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), 1u);
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), HostStatsWorker::kNoTicket);
  w->WaitDone(1);
  EXPECT_NE(w->Result(1, nullptr), nullptr);
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), HostStatsWorker::kNoTicket);
  w->Release(1);  // frees one slot
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), 2u);
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), HostStatsWorker::kNoTicket);
  w->WaitDone(2);
  w->Release(3);
  EXPECT_EQ(w->Submit({}, big.data(), DType::kF32, big.size()), 3u);
}

// Below the wake-up batch a sleeping worker is not woken by Submit; WaitDone and Kick
// must wake it (else these would hang until ctest's timeout). The batch is at most a
// quarter of the capacity: with 8 slots the second job waiting wakes it, with no Kick,
// so the producer never fills its slots for want of a wake.
TEST(HostStatsWorker, WaitDoneKickOrAQuarterOfTheCapacityWakesIt) {
  std::vector<float> small = Normal(100, 3);
  auto w = StartWorker(8);
  ASSERT_NE(w, nullptr);
  for (int round = 0; round < 60; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // let it fall asleep
    uint64_t t = w->Submit({}, small.data(), DType::kF32, small.size());
    ASSERT_NE(t, HostStatsWorker::kNoTicket);
    if (round % 3 == 0) {
      w->WaitDone(t);
    } else if (round % 3 == 1) {
      w->Kick();
      while (w->Done() <= t) std::this_thread::yield();
    } else {
      t = w->Submit({}, small.data(), DType::kF32, small.size());
      ASSERT_NE(t, HostStatsWorker::kNoTicket);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (w->Done() <= t && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();
      }
      ASSERT_GT(w->Done(), t) << "round " << round << ": two jobs waited, not woken";
    }
    EXPECT_NE(w->Result(t, nullptr), nullptr);
    w->Release(t + 1);
  }
}

TEST(HostStatsWorker, RefusedInputHasNoResultAndIsCounted) {
  auto w = StartWorker(4);
  ASSERT_NE(w, nullptr);
  int32_t ints[4] = {1, 2, 3, 4};
  uint64_t t = w->Submit({}, ints, DType::kI32, 4);
  w->WaitDone(t);
  EXPECT_EQ(w->Done(), 1u);
  EXPECT_EQ(w->Result(t, nullptr), nullptr);
  EXPECT_EQ(w->kernel_errors(), 1u);
}

TEST(HostStatsWorker, CapacityOutOfRangeIsAnError) {
  auto w = HostStatsWorker::Start(StatsConfig{}, 0);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("capacity 0"), std::string::npos) << w.status().message();
}

TEST(HostStatsWorker, DestructorFinishesWhatWasSubmittedAndStopsItsNamedThread) {
  const int before = ThreadsNamed("ls-host-stats");
  std::vector<std::vector<float>> bufs;
  for (uint32_t i = 0; i < 8; ++i) bufs.push_back(Normal(200000, i));
  {
    auto w = StartWorker(8);
    ASSERT_NE(w, nullptr);
    EXPECT_EQ(ThreadsNamed("ls-host-stats"), before + 1);
    for (auto& b : bufs) w->Submit({}, b.data(), DType::kF32, b.size());
  }  // joins after computing all eight (TSan/ASan would see a read of freed memory)
  EXPECT_EQ(ThreadsNamed("ls-host-stats"), before);
  bufs.clear();
}

// The producer's loop as the Python recorder runs it: submit, settle whatever is done,
// now and then wait for all; thousands of small jobs with gaps so that the worker goes
// to sleep and is woken many times (the wake-up handshake under TSan).
TEST(HostStatsWorker, ManySmallJobsWithSleepsInBetween) {
  auto w = StartWorker(8);
  ASSERT_NE(w, nullptr);
  std::vector<std::vector<float>> bufs;
  for (uint32_t i = 0; i < 16; ++i) bufs.push_back(Normal(64 + 16 * i, i));
  std::vector<TensorStats> want(bufs.size());
  for (size_t i = 0; i < bufs.size(); ++i) {
    ASSERT_TRUE(ComputeHostStats(bufs[i].data(), DType::kF32, bufs[i].size(), StatsConfig{}, &want[i]).ok());
  }
  uint64_t settled = 0, refused = 0;
  std::vector<size_t> buf_of(8);
  for (uint32_t i = 0; i < 3000; ++i) {
    size_t b = i % bufs.size();
    uint64_t t = w->Submit({i, 0, static_cast<uint32_t>(b), 0}, bufs[b].data(), DType::kF32, bufs[b].size());
    if (t == HostStatsWorker::kNoTicket) {
      ++refused;
    } else {
      buf_of[t % 8] = b;
    }
    if (i % 100 == 99) w->WaitDone(w->Submitted() - 1);
    for (uint64_t done = w->Done(); settled < done; ++settled) {
      HostStatsWorker::Tag tag;
      const TensorStats* got = w->Result(settled, &tag);
      ASSERT_NE(got, nullptr);
      ASSERT_EQ(tag.id, buf_of[settled % 8]);
      ASSERT_EQ(got->l2, want[tag.id].l2);
      w->Release(settled + 1);
    }
    if (i % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  w->WaitDone(w->Submitted() - 1);
  EXPECT_EQ(w->Done(), w->Submitted());
  EXPECT_EQ(w->Submitted() + refused, 3000u);
}

}  // namespace
}  // namespace lockstep
