// The in-process all-reduce (kernels/allreduce.cuh) on 2 GPUs and, when more are visible, on all
// of them (up to 8): allreduce_sum and allreduce_add_rmsnorm against CPU references on fresh
// random partials per rank, single calls over several shapes, calls back to back without a host
// sync (double-buffered slots, grids of 1..128 blocks), 100 replays of a captured graph with new
// inputs written before each, one host thread per rank as the engine drives them, and abort()
// releasing a rank whose peers never come.
// Tolerances: the sum is bit-exact against the fp32 sum in rank order rounded to bf16 (the
// kernel's contract) and within 5e-3 relative L2 of the fp64 sum; the residual is bit-exact
// against bf16(x + that sum); the normalized output is within 5e-3 relative L2 of the fp64 norm
// of that residual (as add_rmsnorm's op case); every rank's outputs are bitwise equal.
// Skips without 2 GPUs with peer access.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/allreduce.cuh"
#include "tests/gpu/gpu_test_util.h"

namespace moebatch::test {
namespace {

using kernels::AllReduceWorkspace;
using kernels::RmsNormParams;
using Bits = std::vector<uint16_t>;

constexpr float kEps = 1e-6f;
constexpr double kTol = 5e-3;
constexpr size_t kMaxBytes = size_t{256} * 4096 * 2;  // the largest shape below

struct Shape {
  int rows, cols;
  size_t n() const { return static_cast<size_t>(rows) * cols; }
};
const Shape kShapes[] = {{1, 2048},  {7, 2048},   {64, 2048}, {256, 2048}, {1, 4096}, {7, 4096},
                         {64, 4096}, {256, 4096}, {1, 136},   {7, 136},    {64, 136}, {256, 136}};

/// Sets `device` current for its lifetime.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    CUDA_CHECK(cudaGetDevice(&prev_));
    CUDA_CHECK(cudaSetDevice(device));
  }
  ~DeviceScope() { cudaSetDevice(prev_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
};

/// A bf16 buffer on one device; copies are stream-ordered on the rank's stream.
class RankBuf {
 public:
  RankBuf(int device, size_t n) : device_(device), n_(n) {
    DeviceScope d(device);
    CUDA_CHECK(cudaMalloc(&p_, n * sizeof(bf16)));
  }
  ~RankBuf() {
    if (!p_) return;
    DeviceScope d(device_);
    cudaFree(p_);
  }
  RankBuf(RankBuf&& o) noexcept
      : device_(o.device_), n_(std::exchange(o.n_, 0)), p_(std::exchange(o.p_, nullptr)) {}
  RankBuf(const RankBuf&) = delete;
  RankBuf& operator=(const RankBuf&) = delete;

  bf16* get() const { return p_; }
  void upload(const Bits& h, cudaStream_t s) {
    MB_CHECK(h.size() == n_, "RankBuf::upload: size");
    CUDA_CHECK(cudaMemcpyAsync(p_, h.data(), n_ * sizeof(bf16), cudaMemcpyHostToDevice, s));
  }
  void poison(cudaStream_t s) { CUDA_CHECK(cudaMemsetAsync(p_, 0xff, n_ * sizeof(bf16), s)); }
  /// Waits for the stream's earlier work (all ranks must have launched theirs by then).
  Bits download(cudaStream_t s) const {
    Bits h(n_);
    CUDA_CHECK(cudaMemcpyAsync(h.data(), p_, n_ * sizeof(bf16), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    return h;
  }

 private:
  int device_;
  size_t n_;
  bf16* p_ = nullptr;
};

/// Ranks 0..world-1 on devices 0..world-1: the workspace and a stream per rank. The tests drive
/// all ranks from one thread in rounds: upload every rank's inputs, launch every rank's calls
/// (interleaved by call), then download — a blocking call while a rank's kernel waits for a peer
/// that is not launched yet would deadlock.
struct Group {
  Group(int world, size_t max_bytes) : ws(devices(world), max_bytes), streams(world) {
    for (int r = 0; r < world; ++r) {
      DeviceScope d(r);
      CUDA_CHECK(cudaStreamCreate(&streams[r]));
    }
  }
  ~Group() {
    for (int r = 0; r < ws.world(); ++r) {
      DeviceScope d(r);
      cudaStreamSynchronize(streams[r]);
      cudaStreamDestroy(streams[r]);
    }
  }
  static std::vector<int> devices(int world) {
    std::vector<int> d(world);
    for (int r = 0; r < world; ++r) d[r] = r;
    return d;
  }
  int world() const { return ws.world(); }

  AllReduceWorkspace ws;
  std::vector<cudaStream_t> streams;
};

// ---- CPU references ----

/// Σ_q parts[q] in fp32 in rank order, rounded to bf16: every rank's result, bit for bit.
Bits sum_rank_order(const std::vector<Bits>& parts) {
  Bits s(parts[0].size());
  for (size_t i = 0; i < s.size(); ++i) {
    float acc = bf2f(parts[0][i]);
    for (size_t q = 1; q < parts.size(); ++q) acc += bf2f(parts[q][i]);
    s[i] = f2bf(acc);
  }
  return s;
}

std::vector<double> sum_fp64(const std::vector<Bits>& parts) {
  std::vector<double> s(parts[0].size(), 0.0);
  for (const Bits& p : parts)
    for (size_t i = 0; i < s.size(); ++i) s[i] += bf2f(p[i]);
  return s;
}

struct NormRef {
  Bits residual;            ///< bf16(x + sum_rank_order): exact
  std::vector<double> out;  ///< fp64 rmsnorm of that residual times w
};

NormRef add_rmsnorm_ref(const std::vector<Bits>& parts, const Bits& x, const Bits& w, Shape s,
                        float offset = 0.f) {
  const Bits sum = sum_rank_order(parts);
  NormRef ref{Bits(s.n()), std::vector<double>(s.n())};
  for (int r = 0; r < s.rows; ++r) {
    double ss = 0;
    for (int c = 0; c < s.cols; ++c) {
      const size_t i = static_cast<size_t>(r) * s.cols + c;
      ref.residual[i] = f2bf(bf2f(x[i]) + bf2f(sum[i]));
      const double v = bf2f(ref.residual[i]);
      ss += v * v;
    }
    const double rstd = 1.0 / std::sqrt(ss / s.cols + kEps);
    for (int c = 0; c < s.cols; ++c) {
      const size_t i = static_cast<size_t>(r) * s.cols + c;
      ref.out[i] = bf2f(ref.residual[i]) * rstd * (offset + bf2f(w[c]));
    }
  }
  return ref;
}

::testing::AssertionResult bits_equal(const Bits& got, const Bits& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  for (size_t i = 0; i < got.size(); ++i)
    if (got[i] != want[i])
      return ::testing::AssertionFailure()
             << "first difference at " << i << ": " << bf2f(got[i]) << " vs " << bf2f(want[i]);
  return ::testing::AssertionSuccess();
}

// ---- one call's buffers on every rank ----

/// allreduce_sum of one shape: per rank a partial and an output (or in place).
struct SumCall {
  SumCall(const Group& g, size_t n, bool in_place) : n(n), in_place(in_place) {
    for (int r = 0; r < g.world(); ++r) {
      in.emplace_back(r, n);
      if (!in_place) out.emplace_back(r, n);
    }
  }
  void upload(Group& g, std::mt19937& rng) {
    parts.clear();
    for (int r = 0; r < g.world(); ++r) {
      parts.push_back(random_bf16(rng, n, 1.f));
      in[r].upload(parts[r], g.streams[r]);
      if (!in_place) out[r].poison(g.streams[r]);
    }
  }
  void launch(Group& g, int r) const {
    DeviceScope d(r);
    kernels::allreduce_sum(g.ws, r, {in_place ? in[r].get() : out[r].get(), in[r].get(), n},
                           g.streams[r]);
  }
  void check(Group& g) const {
    const Bits want = sum_rank_order(parts);
    const std::vector<double> exact = sum_fp64(parts);
    Bits rank0;
    for (int r = 0; r < g.world(); ++r) {
      DeviceScope d(r);
      const Bits got = (in_place ? in[r] : out[r]).download(g.streams[r]);
      EXPECT_TRUE(bits_equal(got, want)) << "sum, rank " << r << " of " << g.world() << ", n " << n;
      EXPECT_TRUE(close_rel_l2(to_float(got), exact, kTol))
          << "sum vs fp64, rank " << r << ", n " << n;
      if (r == 0)
        rank0 = got;
      else
        EXPECT_TRUE(bits_equal(got, rank0)) << "sum: rank " << r << " differs from rank 0";
    }
  }

  size_t n;
  bool in_place;
  std::vector<RankBuf> in, out;
  std::vector<Bits> parts;
};

/// allreduce_add_rmsnorm of one shape: per rank a partial, the residual (same values on every
/// rank), the weight and the output (or out aliasing the partial). Odd row counts apply the
/// weight as 1 + w (Qwen3-Next's zero-centred norms).
struct NormCall {
  NormCall(const Group& g, Shape s, bool out_aliases_in)
      : s(s), alias(out_aliases_in), offset(s.rows % 2 == 1 ? 1.f : 0.f) {
    for (int r = 0; r < g.world(); ++r) {
      in.emplace_back(r, s.n());
      res.emplace_back(r, s.n());
      w.emplace_back(r, static_cast<size_t>(s.cols));
      if (!alias) out.emplace_back(r, s.n());
    }
  }
  void upload(Group& g, std::mt19937& rng) {
    parts.clear();
    x = random_bf16(rng, s.n(), 2.f);
    wt = random_bf16(rng, s.cols, 1.5f);
    for (int r = 0; r < g.world(); ++r) {
      parts.push_back(random_bf16(rng, s.n(), 1.f));
      in[r].upload(parts[r], g.streams[r]);
      res[r].upload(x, g.streams[r]);
      w[r].upload(wt, g.streams[r]);
      if (!alias) out[r].poison(g.streams[r]);
    }
  }
  RmsNormParams params(int r) const {
    RmsNormParams p;
    p.out = alias ? in[r].get() : out[r].get();
    p.in = in[r].get();
    p.residual = res[r].get();
    p.weight = w[r].get();
    p.rows = s.rows;
    p.cols = s.cols;
    p.eps = kEps;
    p.weight_offset = offset;
    return p;
  }
  void launch(Group& g, int r) const {
    DeviceScope d(r);
    kernels::allreduce_add_rmsnorm(g.ws, r, params(r), g.streams[r]);
  }
  void check(Group& g) const {
    const NormRef ref = add_rmsnorm_ref(parts, x, wt, s, offset);
    Bits out0, res0;
    for (int r = 0; r < g.world(); ++r) {
      DeviceScope d(r);
      const Bits got_res = res[r].download(g.streams[r]);
      const Bits got_out = (alias ? in[r] : out[r]).download(g.streams[r]);
      const auto where = [&] {
        return "rank " + std::to_string(r) + " of " + std::to_string(g.world()) + ", rows " +
               std::to_string(s.rows) + " cols " + std::to_string(s.cols);
      };
      EXPECT_TRUE(bits_equal(got_res, ref.residual)) << "residual, " << where();
      EXPECT_TRUE(close_rel_l2(to_float(got_out), ref.out, kTol)) << "out, " << where();
      if (r == 0) {
        out0 = got_out;
        res0 = got_res;
      } else {
        EXPECT_TRUE(bits_equal(got_out, out0)) << "out differs from rank 0, " << where();
        EXPECT_TRUE(bits_equal(got_res, res0)) << "residual differs from rank 0, " << where();
      }
    }
  }

  Shape s;
  bool alias;
  float offset;  // weight_offset
  std::vector<RankBuf> in, res, w, out;
  std::vector<Bits> parts;
  Bits x, wt;
};

class AllReduceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 2) GTEST_SKIP() << "needs 2 CUDA devices";
    n = std::min(n, kernels::kAllReduceMaxWorld);
    for (int a = 0; a < n; ++a)
      for (int b = 0; b < n; ++b) {
        int can = 1;
        if (a != b) CUDA_CHECK(cudaDeviceCanAccessPeer(&can, a, b));
        if (!can) GTEST_SKIP() << "no peer access from device " << a << " to " << b;
      }
    worlds = {2};
    if (n > 2) worlds.push_back(n);
    seed = std::random_device{}();
    rng.seed(seed);
    RecordProperty("seed", std::to_string(seed));
  }
  std::string trace() const { return "seed " + std::to_string(seed); }

  std::vector<int> worlds;
  uint32_t seed = 0;
  std::mt19937 rng;
};

TEST(AllReduceWorkspaceTest, RefusesBadGroups) {  // host checks only: runs without a GPU
  EXPECT_THROW(AllReduceWorkspace({0}, 4096), Error);
  EXPECT_THROW(AllReduceWorkspace({0, 1, 2, 3, 4, 5, 6, 7, 8}, 4096), Error);
  EXPECT_THROW(AllReduceWorkspace({0, 0}, 4096), Error);
  EXPECT_THROW(AllReduceWorkspace({0, 1}, 0), Error);
  EXPECT_GE(AllReduceWorkspace::bytes_per_device(2, 4096), 2 * 2 * size_t{4096});
}

TEST_F(AllReduceTest, SumMatchesReferenceOnEveryRank) {
  SCOPED_TRACE(trace());
  for (int world : worlds) {
    Group g(world, kMaxBytes);
    for (const Shape& s : kShapes)
      for (int rep = 0; rep < 3; ++rep) {  // repeated calls: the epoch advances, parities alternate
        SumCall c(g, s.n(), /*in_place=*/rep == 1);
        c.upload(g, rng);
        for (int r = 0; r < world; ++r) c.launch(g, r);
        c.check(g);
      }
  }
}

TEST_F(AllReduceTest, AddRmsNormMatchesReferenceOnEveryRank) {
  SCOPED_TRACE(trace());
  for (int world : worlds) {
    Group g(world, kMaxBytes);
    for (const Shape& s : kShapes)
      for (int rep = 0; rep < 2; ++rep) {
        NormCall c(g, s, /*out_aliases_in=*/rep == 1);
        c.upload(g, rng);
        for (int r = 0; r < world; ++r) c.launch(g, r);
        c.check(g);
      }
  }
}

// 48 calls of mixed ops and grids (1 to 128 blocks) launched back to back on every rank before
// any host sync: a rank runs ahead into the next launches while its peers still read, which the
// double-buffered slots and the per-block flags must absorb.
TEST_F(AllReduceTest, BackToBackCallsWithoutHostSync) {
  SCOPED_TRACE(trace());
  for (int world : worlds) {
    Group g(world, kMaxBytes);
    std::vector<SumCall> sums;
    std::vector<NormCall> norms;
    std::vector<std::pair<bool, size_t>> order;  // (is_norm, index)
    for (int round = 0; round < 8; ++round) {
      sums.emplace_back(g, 2048, false);
      order.emplace_back(false, sums.size() - 1);
      norms.emplace_back(g, Shape{7, 136}, round % 2 == 1);
      order.emplace_back(true, norms.size() - 1);
      sums.emplace_back(g, size_t{256} * 4096, round % 2 == 0);
      order.emplace_back(false, sums.size() - 1);
      norms.emplace_back(g, Shape{64, 2048}, false);
      order.emplace_back(true, norms.size() - 1);
      norms.emplace_back(g, Shape{256, 4096}, false);
      order.emplace_back(true, norms.size() - 1);
      sums.emplace_back(g, size_t{7} * 136, false);
      order.emplace_back(false, sums.size() - 1);
    }
    for (auto& c : sums) c.upload(g, rng);
    for (auto& c : norms) c.upload(g, rng);
    for (const auto& [is_norm, i] : order)
      for (int r = 0; r < world; ++r) is_norm ? norms[i].launch(g, r) : sums[i].launch(g, r);
    for (const auto& c : sums) c.check(g);
    for (const auto& c : norms) c.check(g);
  }
}

// A graph per rank holding four collectives, replayed 100 times; before each replay new inputs
// are written (and outputs poisoned), after it every result is checked. Every tenth replay is
// followed by an eager call, so eager launches and replays share the epoch sequence.
TEST_F(AllReduceTest, GraphReplayWithFreshInputs) {
  SCOPED_TRACE(trace());
  for (int world : worlds) {
    Group g(world, kMaxBytes);
    NormCall n1(g, {1, 2048}, false), n64(g, {64, 4096}, false), eager(g, {7, 2048}, false);
    SumCall s7(g, size_t{7} * 2048, false), s256(g, size_t{256} * 136, true);
    std::vector<cudaGraphExec_t> exec(world);
    for (int r = 0; r < world; ++r) {
      DeviceScope d(r);
      cudaGraph_t graph;
      CUDA_CHECK(cudaStreamBeginCapture(g.streams[r], cudaStreamCaptureModeThreadLocal));
      n1.launch(g, r);
      s7.launch(g, r);
      n64.launch(g, r);
      s256.launch(g, r);
      CUDA_CHECK(cudaStreamEndCapture(g.streams[r], &graph));
      CUDA_CHECK(cudaGraphInstantiate(&exec[r], graph, 0));
      CUDA_CHECK(cudaGraphDestroy(graph));
    }
    for (int replay = 0; replay < 100; ++replay) {
      SCOPED_TRACE("world " + std::to_string(world) + ", replay " + std::to_string(replay));
      n1.upload(g, rng);
      s7.upload(g, rng);
      n64.upload(g, rng);
      s256.upload(g, rng);
      for (int r = 0; r < world; ++r) {
        DeviceScope d(r);
        CUDA_CHECK(cudaGraphLaunch(exec[r], g.streams[r]));
      }
      n1.check(g);
      s7.check(g);
      n64.check(g);
      s256.check(g);
      if (replay % 10 == 9) {
        eager.upload(g, rng);
        for (int r = 0; r < world; ++r) eager.launch(g, r);
        eager.check(g);
      }
      if (HasFailure()) break;  // one replay's report is enough
    }
    for (int r = 0; r < world; ++r) {
      DeviceScope d(r);
      CUDA_CHECK(cudaGraphExecDestroy(exec[r]));
    }
  }
}

// The engine's shape of use: one host thread per rank, 20 fused calls chained on the residual
// (layer after layer), no host sync between them.
TEST_F(AllReduceTest, ThreadPerRankChainedLayers) {
  SCOPED_TRACE(trace());
  constexpr int kLayers = 20;
  const Shape s{7, 2048};
  for (int world : worlds) {
    Group g(world, kMaxBytes);
    const Bits x0 = random_bf16(rng, s.n(), 2.f), w = random_bf16(rng, s.cols, 1.5f);
    std::vector<std::vector<Bits>> parts(kLayers);  // [layer][rank]
    for (auto& layer : parts)
      for (int r = 0; r < world; ++r) layer.push_back(random_bf16(rng, s.n(), 1.f));
    std::vector<Bits> final_res(world);
    std::vector<std::vector<Bits>> outs(world);
    std::vector<std::exception_ptr> errors(world);
    std::vector<std::thread> threads;
    for (int r = 0; r < world; ++r)
      threads.emplace_back([&, r] {
        try {
          CUDA_CHECK(cudaSetDevice(r));
          const cudaStream_t st = g.streams[r];
          std::vector<RankBuf> in, out;
          RankBuf res(r, s.n()), wb(r, s.cols);
          res.upload(x0, st);
          wb.upload(w, st);
          for (int l = 0; l < kLayers; ++l) {
            in.emplace_back(r, s.n());
            out.emplace_back(r, s.n());
            in.back().upload(parts[l][r], st);
          }
          for (int l = 0; l < kLayers; ++l) {
            RmsNormParams p;
            p.out = out[l].get();
            p.in = in[l].get();
            p.residual = res.get();
            p.weight = wb.get();
            p.rows = s.rows;
            p.cols = s.cols;
            p.eps = kEps;
            kernels::allreduce_add_rmsnorm(g.ws, r, p, st);
          }
          for (int l = 0; l < kLayers; ++l) outs[r].push_back(out[l].download(st));
          final_res[r] = res.download(st);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    Bits x = x0;
    for (int l = 0; l < kLayers; ++l) {
      const NormRef ref = add_rmsnorm_ref(parts[l], x, w, s);
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(close_rel_l2(to_float(outs[r][l]), ref.out, kTol))
            << "layer " << l << ", rank " << r;
        EXPECT_TRUE(bits_equal(outs[r][l], outs[0][l]))
            << "layer " << l << ", rank " << r << " differs from rank 0";
      }
      x = ref.residual;
    }
    for (int r = 0; r < world; ++r)
      EXPECT_TRUE(bits_equal(final_res[r], x)) << "final residual, rank " << r;
  }
}

// A rank whose peers never launch (a hung peer) spins in its barrier until abort(): the kernel
// is still running after 200 ms, returns within a few seconds of abort(), and the workspace
// refuses later calls instead of mixing epochs.
TEST_F(AllReduceTest, AbortReleasesARankWaitingForItsPeers) {
  using Clock = std::chrono::steady_clock;
  for (int world : worlds) {
    Group g(world, kMaxBytes);
    for (bool fused : {false, true}) {
      SCOPED_TRACE(fused ? "allreduce_add_rmsnorm" : "allreduce_sum");
      Group lone(world, kMaxBytes);  // a fresh workspace per case: abort spends it
      NormCall norm(lone, {7, 2048}, false);
      SumCall sum(lone, 2048, false);
      norm.upload(lone, rng);
      sum.upload(lone, rng);
      CUDA_CHECK(cudaStreamSynchronize(lone.streams[0]));
      fused ? norm.launch(lone, 0) : sum.launch(lone, 0);  // rank 0 only
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      {
        DeviceScope d(0);
        EXPECT_EQ(cudaStreamQuery(lone.streams[0]), cudaErrorNotReady)
            << "returned without its peers";
      }
      const Clock::time_point t0 = Clock::now();
      lone.ws.abort();
      {
        DeviceScope d(0);
        CUDA_CHECK(cudaStreamSynchronize(lone.streams[0]));
      }
      EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
      EXPECT_TRUE(lone.ws.aborted());
      EXPECT_THROW(sum.launch(lone, 0), Error);
      EXPECT_THROW(norm.launch(lone, 1), Error);
    }
    // the other group's workspace is untouched: a healthy call still matches the reference
    SumCall ok(g, 2048, false);
    ok.upload(g, rng);
    for (int r = 0; r < world; ++r) ok.launch(g, r);
    ok.check(g);
  }
}

}  // namespace
}  // namespace moebatch::test
