// Exact group trackers in the real DeltaProduct LM: hand-set weights, loaded through
// the model's public parameter names, make a one-layer `gated_deltaproduct` with eigenvalues in
// [-1,1] compute the prefix product of a group word for 10,000 steps in fp32 — in-process and
// through a run directory and `lrnn predict`:
// - Z5 with n_h = 2: each element m is the rotation R(2*pi*m/5) of a plane, the product of two
//   reflections (beta = 2) whose axes are pi*m/5 apart; the identity uses beta = 0.
// - S3 with n_h = 2 and S5 with n_h = 4: each permutation acts on R^n by its permutation matrix,
//   written as at most n-1 transpositions, each the reflection I - 2 k k^T, k = (e_i - e_j)/sqrt2
//   (beta = 2); unused sub-steps have beta = 0.
// Tokens are group elements (lexicographic order of permutations, 0 = identity; Z5: m), as the
// word_problem task numbers them; the expected answers come from permutation composition done
// here, y_t = y_{t-1} ∘ x_t, (a ∘ b)(i) = a(b(i)). The same weights with eigenvalues in [0,1]
// (beta = sigmoid = 1: projections instead of reflections) fail.
//
// The construction, per head (head_dim Dk, the representation R^r: r = 2 for Z5, n for S_n):
// 1. Representation inside the key space: r orthonormal vectors u_i, each spread evenly over a
//    block of m = Dk / r coordinates. A sub-step with unit kappa in R^r uses k = sum_i kappa_i u_i.
//    Keys come out of SiLU, whose values are >= -0.278, so the negative entries are kept at
//    -0.27 and the rest scaled to match; spreading over m coordinates makes |k| large before the
//    L2 norm, so its eps (1e-6) leaves |k|^2 = 1 - O(1e-7): each reflection then shrinks the
//    state along k by ~1e-6, i.e. ~1% over 10^4 tokens (measured below as drift).
// 2. Values: v = C^T k with C = gamma sum_i u_i c_i^T (c_i the first r value coordinates). Then
//    X = S - C obeys X' = (I - beta k k^T) X exactly, for any beta: the delta rule's affine
//    part is absorbed, X_0 = -C, and after the word y the state is S = C - Q_y C, Q_y the
//    matrix of y (Z5: R(y); S_n: the transpose of y's permutation matrix, so that the left
//    multiplications of the recurrence compose as y_{t-1} ∘ x_t).
// 3. Readout: q = sum_i w_i u_i (a different positive w per head) gives
//    o = gamma (w - Q_y^T w) / sqrt(Dk) in the c coordinates; o_norm (RMSNorm, eps 1e-6) makes it
//    ~unit RMS (identity: o = 0 stays ~0); o_proj copies it into the residual. lm_head is a
//    nearest-template classifier: logit_y = G (<rho, T_y> - |T_y|^2 / 2) with T_y the exact
//    (double) readout of class y, the bias through a constant residual direction. model.norm
//    only rescales the residual by a positive factor, so the argmax is the nearest template.
// 4. Embeddings: one constant direction e_A and one direction per token; every projection reads
//    the token's direction (q and the output gate read e_A). The MLP is switched off.
// The "gated" variant switches on short conv (kernels [0,0,0,1]: identity), the forget gate
// (a_proj = 0, dt_bias = -100: decay exp(-exp(0) * softplus(-100)) = 1 in fp32) and the output
// gate (SiLU(20) = 20 from e_A, o_norm weight 1/20), so those paths carry the same exact state.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include "ops/delta_rule/delta_rule.h"
#include "tracker_util.h"

using namespace lrnn;
using namespace lrnn::tracker;

namespace {

constexpr double kEps = 1e-6;        // norm_eps and the L2 norm's eps
constexpr double kNegFloor = -0.27;  // most negative SiLU output used (SiLU >= -0.2785)
constexpr double kBetaLogit = 50.0;  // sigmoid(+-50) is 1 / ~2e-22 in fp32
constexpr double kGain = 4.0;        // G in lm_head

using Mat = std::vector<double>;  // r x r, row-major

double silu(double x) { return x / (1 + std::exp(-x)); }
// SiLU is increasing on [-1.2785, inf): invert there by bisection.
double silu_inv(double y) {
  double lo = -1.2784645427610738, hi = std::max(1.0, y + 10.0);
  EXPECT_GT(y, silu(lo));
  for (int i = 0; i < 200; ++i) {
    double mid = 0.5 * (lo + hi);
    (silu(mid) < y ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// ---- the groups, as this test knows them (independent of src/tasks) ----

struct SubStep {
  std::vector<double> kappa;  // unit vector in R^r
  bool reflect;               // beta = 2 (else 0)
};

struct GroupSpec {
  std::string name;  // the word_problem task's task.group
  int order = 0, r = 0;
  std::vector<Mat> Q;                       // Q_y: what the state holds after a word with product y
  std::vector<std::vector<SubStep>> steps;  // per token x: n_h sub-steps in the kernel's order
  std::function<int(int, int)> compose;     // a ∘ b
};

Mat matmul(const Mat& a, const Mat& b, int r) {
  Mat c(r * r, 0.0);
  for (int i = 0; i < r; ++i)
    for (int k = 0; k < r; ++k)
      for (int j = 0; j < r; ++j) c[i * r + j] += a[i * r + k] * b[k * r + j];
  return c;
}
Mat householder(const std::vector<double>& k, double beta, int r) {
  Mat h(r * r);
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < r; ++j) h[i * r + j] = (i == j) - beta * k[i] * k[j];
  return h;
}
std::vector<double> unit(int r, int i) {
  std::vector<double> e(r, 0.0);
  e[i] = 1;
  return e;
}

GroupSpec cyclic(int m, int nh) {
  GroupSpec g{fmt::format("Z{}", m), m, 2};
  for (int y = 0; y < m; ++y) {
    double a = 2 * M_PI * y / m;
    g.Q.push_back({std::cos(a), -std::sin(a), std::sin(a), std::cos(a)});
    // Reflections across the lines normal to (1,0) and to (cos(pi y/m), sin(pi y/m)): their
    // product is the rotation by twice the angle between them.
    std::vector<SubStep> s;
    if (y == 0) s = {{unit(2, 0), false}, {unit(2, 0), false}};
    else s = {{unit(2, 0), true}, {{std::cos(M_PI * y / m), std::sin(M_PI * y / m)}, true}};
    while (int(s.size()) < nh) s.push_back({unit(2, 0), false});
    g.steps.push_back(s);
  }
  g.compose = [m](int a, int b) { return (a + b) % m; };
  return g;
}

GroupSpec symmetric(int n, int nh) {
  std::vector<std::vector<int>> perms;
  std::vector<int> p(n);
  std::iota(p.begin(), p.end(), 0);
  do perms.push_back(p);
  while (std::next_permutation(p.begin(), p.end()));
  GroupSpec g{fmt::format("S{}", n), int(perms.size()), n};
  auto index = [perms](const std::vector<int>& q) { return int(std::find(perms.begin(), perms.end(), q) - perms.begin()); };
  g.compose = [perms, index, n](int a, int b) {
    std::vector<int> c(n);
    for (int i = 0; i < n; ++i) c[i] = perms[a][perms[b][i]];
    return index(c);
  };
  for (auto& q : perms) {
    // Q = M(q)^T, M(q) e_i = e_{q(i)}.
    Mat Q(n * n, 0.0);
    for (int i = 0; i < n; ++i) Q[i * n + q[i]] = 1;
    g.Q.push_back(Q);
    // A(x) = M(x)^T = M(x^-1). Write rho = x^-1 = t_1 ∘ ... ∘ t_k by sorting it with swaps from the
    // left: t_k ∘ ... ∘ t_1 ∘ rho = id. M(rho) = M(t_1)...M(t_k): the kernel applies M(t_k) first.
    std::vector<int> cur(n);
    for (int i = 0; i < n; ++i) cur[q[i]] = i;  // inverse
    std::vector<std::pair<int, int>> swaps;
    for (int i = 0; i < n; ++i)
      if (cur[i] != i) {
        const int a = i, b = cur[i];
        for (auto& v : cur) v = v == a ? b : (v == b ? a : v);  // cur = (a b) ∘ cur
        swaps.push_back({a, b});
      }
    std::vector<SubStep> s;
    for (auto it = swaps.rbegin(); it != swaps.rend(); ++it) {
      std::vector<double> k(n, 0.0);
      k[it->first] = M_SQRT1_2, k[it->second] = -M_SQRT1_2;
      s.push_back({k, true});
    }
    EXPECT_LE(int(s.size()), nh);
    while (int(s.size()) < nh) s.push_back({unit(n, 0), false});
    g.steps.push_back(s);
  }
  return g;
}

// The construction is right in exact arithmetic: the sub-steps of x multiply to A(x), and
// A(x) Q_y = Q_{y ∘ x}, with Q_identity = I.
void check_construction(const GroupSpec& g) {
  const int r = g.r;
  for (int i = 0; i < r; ++i)
    for (int j = 0; j < r; ++j) ASSERT_NEAR(g.Q[0][i * r + j], i == j, 1e-15) << g.name;
  for (int x = 0; x < g.order; ++x) {
    Mat A = householder(unit(r, 0), 0.0, r);
    for (auto& s : g.steps[x]) A = matmul(householder(s.kappa, s.reflect ? 2.0 : 0.0, r), A, r);
    for (int y = 0; y < g.order; ++y) {
      Mat want = g.Q[g.compose(y, x)], got = matmul(A, g.Q[y], r);
      for (int i = 0; i < r * r; ++i) ASSERT_NEAR(got[i], want[i], 1e-12) << g.name << " x=" << x << " y=" << y;
    }
  }
}

// ---- the model ----

struct Shape {
  int nh, H, Dk;   // sub-steps, heads, key width
  bool gated;      // short conv + forget gate + output gate switched on (as identities)
};

struct Tracker {
  std::unique_ptr<Model<float>> model;
  YAML::Node block;
  std::vector<std::vector<double>> T;  // T[y]: template of class y, [H * r]
  double min_gap = 0;                  // min over y != y' of |T_y - T_y'|^2 / 2
};

Tracker build(const GroupSpec& g, const Shape& s, bool neg_eigval) {
  const int r = g.r, H = s.H, Dk = s.Dk, nh = s.nh, Dv = r, m = Dk / r;
  const int V = g.order + 1, d = 1 + g.order + H * r;  // e_A | one per token | readout
  const int kA = 0, pad = g.order;
  auto tok_dim = [](int x) { return 1 + x; };
  auto out_dim = [&](int h, int i) { return 1 + g.order + h * r + i; };

  Tracker t;
  YAML::Node b;
  b["model_type"] = "gated_deltaproduct";
  b["vocab_size"] = V;
  b["hidden_size"] = d;
  b["num_hidden_layers"] = 1;
  b["num_heads"] = H;
  b["head_dim"] = Dk;
  b["expand_v"] = double(Dv) / Dk;
  b["num_householder"] = nh;
  b["allow_neg_eigval"] = neg_eigval;
  b["use_short_conv"] = s.gated;
  b["use_forget_gate"] = s.gated;
  b["use_output_gate"] = s.gated;
  b["intermediate_size"] = 8;
  b["norm_eps"] = kEps;
  t.block = b;
  t.model = create_model<float>(b, "tracker", 1);
  Model<float>& M = *t.model;
  std::fill(M.params.begin(), M.params.end(), 0.0f);
  const std::string p = "model.layers.0.";

  // Embeddings: c e_A (+ a e_token); after attn_norm (weight 1) every token is r1 (e_A + e_tok).
  float* emb = param(M, "model.embeddings.weight", {V, d});
  for (int x = 0; x < V; ++x) {
    emb[x * d + kA] = 1.0f;
    if (x != pad) emb[x * d + tok_dim(x)] = 1.0f;
  }
  const double r1 = 1.0 / std::sqrt(2.0 / d + kEps), xA = r1, xT = r1;
  for (const char* n : {"attn_norm.weight", "mlp_norm.weight"}) {
    float* w = param(M, p + n, {d});
    std::fill(w, w + d, 1.0f);
  }
  float* fn = param(M, "model.norm.weight", {d});
  std::fill(fn, fn + d, 1.0f);

  // Keys, values, betas per token and sub-step (the same in every head).
  double worst_neg = 0;  // most negative kappa entry over all reflections
  for (int x = 0; x < g.order; ++x)
    for (auto& st : g.steps[x])
      for (double k : st.kappa) worst_neg = std::max(worst_neg, -k);
  const double gamma = std::min(1.0, -kNegFloor / worst_neg);  // v = gamma * <u_i, k> >= -0.27
  float* Wq = param(M, p + "attn.q_proj.weight", {H * Dk, d});
  float* Wk = param(M, p + "attn.k_proj.weight", {nh * H * Dk, d});
  float* Wv = param(M, p + "attn.v_proj.weight", {nh * H * Dv, d});
  float* Wb = param(M, p + "attn.b_proj.weight", {nh * H, d});
  for (int x = 0; x < g.order; ++x)
    for (int j = 0; j < nh; ++j) {
      const auto& kap = g.steps[x][j].kappa;
      double mn = 0;
      for (double v : kap) mn = std::min(mn, v);
      // k entries kappa_i * lam / sqrt(m) in block i, the most negative at -0.27.
      const double lam = mn < 0 ? kNegFloor * std::sqrt(double(m)) / mn : 2.0;
      std::vector<double> pre(Dk, 0.0), k(Dk, 0.0);
      double ss = 0;
      for (int i = 0; i < r; ++i)
        for (int l = 0; l < m; ++l) {
          pre[i * m + l] = silu_inv(kap[i] * lam / std::sqrt(double(m)));
          k[i * m + l] = silu(pre[i * m + l]);
          ss += k[i * m + l] * k[i * m + l];
        }
      for (auto& v : k) v /= std::sqrt(ss + kEps);  // what the model's L2 norm makes of it
      for (int h = 0; h < H; ++h) {
        for (int e = 0; e < Dk; ++e) Wk[((j * H + h) * Dk + e) * d + tok_dim(x)] = float(pre[e] / xT);
        for (int i = 0; i < r; ++i) {
          double uk = 0;  // <u_i, k>
          for (int l = 0; l < m; ++l) uk += k[i * m + l] / std::sqrt(double(m));
          Wv[((j * H + h) * Dv + i) * d + tok_dim(x)] = float(silu_inv(gamma * uk) / xT);
        }
        Wb[(j * H + h) * d + tok_dim(x)] = float((g.steps[x][j].reflect ? kBetaLogit : -kBetaLogit) / xT);
      }
    }

  // Queries: q = sum_i w_i u_i, a different positive w per head (from e_A); o_norm; o_proj.
  const double gate = s.gated ? 20.0 : 1.0, onw = 1.0 / gate;  // silu(20) == 20 in fp32
  float* on = param(M, p + "attn.o_norm.weight", {Dv});
  std::fill(on, on + Dv, float(onw));
  float* Wo = param(M, p + "attn.o_proj.weight", {d, H * Dv});
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> U(1.0, 3.0);
  std::vector<std::vector<double>> qt(H, std::vector<double>(r));  // <u_i, q> per head
  for (int h = 0; h < H; ++h) {
    std::vector<double> w(r), q(Dk, 0.0);
    for (auto& v : w) v = U(rng);
    double ss = 0;
    for (int i = 0; i < r; ++i)
      for (int l = 0; l < m; ++l) {
        const double pre = silu_inv(w[i] / std::sqrt(double(m)));
        Wq[(h * Dk + i * m + l) * d + kA] = float(pre / xA);
        q[i * m + l] = silu(pre);
        ss += q[i * m + l] * q[i * m + l];
      }
    for (int i = 0; i < r; ++i) {
      qt[h][i] = 0;
      for (int l = 0; l < m; ++l) qt[h][i] += q[i * m + l] / std::sqrt(ss + kEps) / std::sqrt(double(m));
      Wo[out_dim(h, i) * (H * Dv) + h * Dv + i] = 1.0f;
    }
  }
  // Templates: the exact readout rho of class y: o = gamma (qt - Q_y^T qt) / sqrt(Dk), then o_norm.
  t.T.assign(g.order, std::vector<double>(H * r));
  for (int y = 0; y < g.order; ++y)
    for (int h = 0; h < H; ++h) {
      std::vector<double> o(r);
      double ss = 0;
      for (int i = 0; i < r; ++i) {
        double qy = 0;
        for (int j = 0; j < r; ++j) qy += g.Q[y][j * r + i] * qt[h][j];
        o[i] = gamma * (qt[h][i] - qy) / std::sqrt(double(Dk));
        ss += o[i] * o[i];
      }
      for (int i = 0; i < r; ++i) t.T[y][h * r + i] = o[i] / std::sqrt(ss / Dv + kEps) * double(float(onw)) * gate;
    }
  t.min_gap = INFINITY;
  for (int y = 0; y < g.order; ++y)
    for (int z = 0; z < y; ++z) {
      double dd = 0;
      for (int i = 0; i < H * r; ++i) dd += (t.T[y][i] - t.T[z][i]) * (t.T[y][i] - t.T[z][i]);
      t.min_gap = std::min(t.min_gap, dd / 2);
    }
  // lm_head: logit_y = G (<rho, T_y> - |T_y|^2 / 2), the bias through e_A (model.norm scales
  // h[A] = 1 and rho alike); pad: -G, never the answer.
  float* head = param(M, "lm_head.weight", {V, d});
  for (int y = 0; y < g.order; ++y) {
    double n2 = 0;
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < r; ++i) {
        head[y * d + out_dim(h, i)] = float(kGain * t.T[y][h * r + i]);
        n2 += t.T[y][h * r + i] * t.T[y][h * r + i];
      }
    head[y * d + kA] = float(-kGain * n2 / 2);
  }
  head[pad * d + kA] = float(-kGain);

  if (s.gated) {
    for (const char* n : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
      const ParamEntry& e = M.layout().at(p + "attn." + n + ".weight");
      for (size_t c = 0; c < e.numel / 4; ++c) M.params[e.offset + c * 4 + 3] = 1.0f;  // [0,0,0,1]
    }
    // a_proj = 0, A_log = 0, dt_bias = -100: log decay -softplus(-100) ~ -4e-44, decay 1.
    float* dt = param(M, p + "attn.dt_bias", {H});
    std::fill(dt, dt + H, -100.0f);
    float* Wg = param(M, p + "attn.g_proj.weight", {H * Dv, d});
    for (int c = 0; c < H * Dv; ++c) Wg[c * d + kA] = float(gate / xA);
  }
  return t;
}

std::vector<int32_t> prefix_products(const GroupSpec& g, const std::vector<int32_t>& x) {
  std::vector<int32_t> y(x.size());
  int acc = 0;
  for (size_t t = 0; t < x.size(); ++t) y[t] = acc = g.compose(acc, x[t]);
  return y;
}

// Two words: uniform random elements, and one element of maximal order repeated (the same
// reflections over and over: rounding errors of one kind add up coherently, if they can).
std::vector<std::vector<int32_t>> test_words(const GroupSpec& g, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> U(0, g.order - 1);
  std::vector<int32_t> a(kSteps), b(kSteps);
  for (auto& v : a) v = U(rng);
  int best = 1, best_order = 0;
  for (int x = 1; x < g.order; ++x) {
    int k = 1;
    for (int y = x; y != 0; y = g.compose(y, x)) ++k;
    if (k > best_order) best = x, best_order = k;
  }
  std::fill(b.begin(), b.end(), best);
  return {a, b};
}

struct Case {
  const char* name;
  std::function<GroupSpec()> group;
  Shape shape;
};

class GroupTracker : public ::testing::TestWithParam<Case> {};

void check_tracks(const Case& c) {
  auto t0 = std::chrono::steady_clock::now();
  GroupSpec g = c.group();
  check_construction(g);
  Tracker tr = build(g, c.shape, /*neg_eigval=*/true);
  ASSERT_GT(tr.min_gap, 0.02) << "templates too close: the construction cannot separate the classes";
  auto rows = test_words(g, 2024);
  const int B = int(rows.size()), V = g.order + 1;
  const float* lg = forward_rows(*tr.model, rows);
  for (int b = 0; b < B; ++b) {
    auto want = prefix_products(g, rows[b]);
    int wrong = 0, first_wrong = -1;
    double lo_start = INFINITY, lo_end = INFINITY;
    for (int t = 0; t < kSteps; ++t) {
      const float* row = lg + (size_t(b) * kSteps + t) * V;
      if (argmax(row, V) != want[t] && wrong++ == 0) first_wrong = t;
      const double gp = gap(row, V, want[t]);
      if (t < 1000) lo_start = std::min(lo_start, gp);
      if (t >= kSteps - 1000) lo_end = std::min(lo_end, gp);
    }
    EXPECT_EQ(wrong, 0) << "row " << b << ": first wrong prediction at position " << first_wrong;
    // The margin stays: the state's drift over 10^4 tokens (see the header) costs < 25% of it.
    EXPECT_GT(lo_end, 0.75 * lo_start) << "row " << b;
    std::printf("[tracker] %s row %d: min margin %.4f (first 1000 steps) -> %.4f (last 1000), designed "
                "min |T_y - T_y'|^2/2 = %.4f\n", c.name, b, lo_start, lo_end, tr.min_gap);
  }
  std::printf("[tracker] %s: build + forward of %dx%d tokens in %.2f s\n", c.name, B, kSteps, seconds_since(t0));
}

TEST_P(GroupTracker, TracksPrefixProductsExactlyFor10kSteps) { check_tracks(GetParam()); }

// The same through the delta rule's chunked (WY) form (chunks of 64 / n_h tokens: triangular solves
// over the sub-steps' reflections), with the same bounds.
TEST_P(GroupTracker, TracksThroughTheChunkedDeltaRule) {
  ops::set_delta_rule_algorithm(ops::DeltaAlgorithm::Chunked);
  check_tracks(GetParam());
  ops::set_delta_rule_algorithm(ops::DeltaAlgorithm::Auto);
}

TEST_P(GroupTracker, SameWeightsWithEigenvaluesInUnitIntervalFail) {
  // beta = sigmoid(50) = 1: every "reflection" is a projection I - k k^T, which forgets.
  const Case& c = GetParam();
  GroupSpec g = c.group();
  Tracker tr = build(g, c.shape, /*neg_eigval=*/false);
  auto rows = test_words(g, 2025);
  const int V = g.order + 1;
  tr.model->forward(rows[0].data(), nullptr, 1, kSteps);
  auto want = prefix_products(g, rows[0]);
  int right = 0;
  for (int t = 0; t < kSteps; ++t) right += argmax(tr.model->logits() + size_t(t) * V, V) == want[t];
  std::printf("[tracker] %s [0,1]: accuracy %.4f (chance %.4f)\n", c.name, double(right) / kSteps, 1.0 / g.order);
  EXPECT_LT(double(right) / kSteps, 0.5);
}

// A run directory as `lrnn train` writes it (config.yaml with the word_problem task,
// model.safetensors + config.json), then `lrnn predict` on 10,000 tokens.
TEST_P(GroupTracker, CliPredictTracksFor10kTokens) {
  auto t0 = std::chrono::steady_clock::now();
  const Case& c = GetParam();
  GroupSpec g = c.group();
  Tracker tr = build(g, c.shape, /*neg_eigval=*/true);
  TempDir dir(fmt::format("lrnn_grouptracker_{}", c.name));
  YAML::Node task;
  task["name"] = "word_problem";
  task["group"] = g.name;
  write_run(dir.path, task, tr.block, *tr.model, "tracker test");

  auto word = test_words(g, 4242)[0];
  Predictions r;
  ASSERT_NO_FATAL_FAILURE(predict(dir.path, word, prefix_products(g, word), g.order + 1, " --logits", &r));
  EXPECT_EQ(r.wrong, 0) << "first wrong prediction at position " << r.first_wrong;
  EXPECT_GT(r.min_margin, 0.0);
  std::printf("[tracker] cli %s: %d positions, min margin %.4f, %.2f s (with writing the run)\n", c.name, kSteps,
              r.min_margin, seconds_since(t0));

  // `lrnn eval` on new words of the task: every prediction right, so sequence accuracy stays 1 up
  // to the longest length evaluated, which its table reports as P2's measure of reach.
  const std::string cmd = fmt::format("'{}' eval --run '{}' --set task.eval_len=[40,40] task.eval_samples=16 2>&1",
                                      LRNN_BINARY, dir.path.string());
  FILE* f = ::popen(cmd.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::string out;
  char buf[1 << 12];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(f), 0) << out;
  EXPECT_NE(out.find("sequence accuracy >= 0.9 at every length evaluated (up to 40)"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(
    Groups, GroupTracker,
    ::testing::Values(Case{"Z5_nh2", [] { return cyclic(5, 2); }, {2, 2, 64, false}},
                      Case{"Z5_nh2_gated", [] { return cyclic(5, 2); }, {2, 2, 64, true}},
                      Case{"S3_nh2", [] { return symmetric(3, 2); }, {2, 2, 96, false}},
                      Case{"S3_nh2_gated", [] { return symmetric(3, 2); }, {2, 2, 96, true}},
                      Case{"S5_nh4", [] { return symmetric(5, 4); }, {4, 4, 128, false}},
                      Case{"S5_nh4_gated", [] { return symmetric(5, 4); }, {4, 4, 128, true}}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
