#include "core/nvfp4.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/float8.h"
#include "core/range.h"
#include "core/range_kernels.h"
#include "core/status_macros.h"

namespace qparams {
namespace {

// The e4m3 maximum times the e2m1 maximum, 448.0 * 6.0 in both libraries (exact).
constexpr double kE4M3TimesE2M1Max = 2688.0;
constexpr float kE4M3Max = 448.0f;
// compressed-tensors' _get_dtype_eps(float8_e4m3fn), the code of 0.125.
constexpr uint8_t kCompressedTensorsZeroBlockCode = 0x20;

// fl_P of a value computed in float (§1: a 16-bit op runs in float, then rounds).
float RoundTo(DType precision, float v) {
  switch (precision) {
    case DType::kBFloat16:
      return RoundToBFloat16(v);
    case DType::kFloat16:
      return RoundToHalf(v);
    default:
      return v;
  }
}

// torch.finfo(P).tiny.
double Tiny(DType precision) {
  switch (precision) {
    case DType::kFloat16:
      return 0x1.0p-14;
    case DType::kFloat64:
      return std::numeric_limits<double>::min();
    default:
      return 0x1.0p-126;
  }
}

// torch.max / torch.clamp keep NaN; std::max and std::min would drop it.
double NanMax(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? std::numeric_limits<double>::quiet_NaN() : std::max(a, b);
}

// compressed-tensors generate_gparam: 448.0 * 6.0 / max(A, tiny) in P, which torch
// computes as a reciprocal and a product (Tensor.__rtruediv__), not a division.
float CompressedTensorsGlobalScale(double amax, DType precision) {
  const double a = NanMax(amax, Tiny(precision));
  double g;
  if (precision == DType::kFloat64) {
    g = (1.0 / a) * kE4M3TimesE2M1Max;
  } else {
    const float r = RoundTo(precision, 1.0f / static_cast<float>(a));
    g = RoundTo(precision, r * static_cast<float>(kE4M3TimesE2M1Max));
  }
  if (!std::isfinite(g)) g = 1.0;  // nan_to_num(nan=1.0, posinf=1.0, neginf=1.0)
  return static_cast<float>(g);
}

// ModelOpt get_weights_scaling_factor_2, in float32 after .float(), with the
// service's floor at 2^-126 (nvfp4.md §8 item 8).
float ModelOptGlobalScale(double amax) {
  const float a = std::max(static_cast<float>(amax), 0x1.0p-126f);
  return a / static_cast<float>(kE4M3TimesE2M1Max);
}

uint8_t CompressedTensorsBlockCode(double block_amax, float global_scale, DType precision) {
  double s;
  if (precision == DType::kFloat64) {
    // gs * t promotes to float64; the e4m3 cast then goes through float32.
    s = static_cast<double>(global_scale) * (block_amax / 6.0);
  } else {
    const float t = RoundTo(precision, static_cast<float>(block_amax) / 6.0f);
    s = global_scale * t;  // float32 by type promotion, whatever P is
  }
  s = std::isnan(s) ? s : std::clamp(s, -448.0, 448.0);
  uint8_t code = FloatToFloat8E4M3Fn(static_cast<float>(s));
  // torch.where(scales == 0, eps, scales): an all-zero block, or one whose scale
  // underflows e4m3.
  if (Float8E4M3FnToFloat(code) == 0.0f) code = kCompressedTensorsZeroBlockCode;
  return code;
}

uint8_t ModelOptBlockCode(double block_amax, float global_scale) {
  const float den = 6.0f * global_scale;
  float s = static_cast<float>(block_amax) / den;
  if (s == 0.0f) s = 1.0f;  // before the cast: an underflowed block keeps code 0x00
  if (!std::isnan(s)) s = std::min(s, kE4M3Max);
  return FloatToFloat8E4M3Fn(s);
}

}  // namespace

absl::string_view Nvfp4ConventionName(Nvfp4Convention convention) {
  return convention == Nvfp4Convention::kModelOpt ? "modelopt" : "compressed_tensors";
}

absl::StatusOr<Nvfp4Convention> ParseNvfp4Convention(absl::string_view name) {
  if (name.empty() || name == "compressed_tensors") return Nvfp4Convention::kCompressedTensors;
  if (name == "modelopt") return Nvfp4Convention::kModelOpt;
  return absl::InvalidArgumentError(
      absl::StrCat("spec.convention is \"", name,
                   "\"; it must be \"\", \"compressed_tensors\" or \"modelopt\""));
}

double Nvfp4BlockAmax(double lo, double hi) {
  return NanMax(std::fabs(std::min(lo, 0.0)), std::fabs(std::max(hi, 0.0)));
}

float Nvfp4GlobalScale(double amax, DType precision, Nvfp4Convention convention) {
  return convention == Nvfp4Convention::kModelOpt ? ModelOptGlobalScale(amax)
                                                  : CompressedTensorsGlobalScale(amax, precision);
}

uint8_t Nvfp4BlockScaleCode(double block_amax, float global_scale, DType precision,
                            Nvfp4Convention convention) {
  return convention == Nvfp4Convention::kModelOpt
             ? ModelOptBlockCode(block_amax, global_scale)
             : CompressedTensorsBlockCode(block_amax, global_scale, precision);
}

Nvfp4Scales ComputeNvfp4Scales(const std::vector<double>& lo, const std::vector<double>& hi,
                               DType precision, Nvfp4Convention convention) {
  // Two passes over the range, each on the range pass's threads: a weight has a
  // million blocks, and recomputing a block's amax is cheaper than storing them.
  const int64_t n = static_cast<int64_t>(lo.size());
  const int threads = RangeThreadsFor(n);
  // One slot per thread rather than a critical section: TSan's OpenMP tool (Archer)
  // crashes in __kmpc_end_critical, and the merge is a handful of maxima anyway.
  std::vector<double> per_thread(threads, 0.0);
#pragma omp parallel num_threads(threads)
  {
    double local = 0;
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < n; ++i) local = NanMax(local, Nvfp4BlockAmax(lo[i], hi[i]));
    per_thread[omp_get_thread_num()] = local;
  }
  // NanMax is commutative and associative: the order of the threads does not matter.
  double amax = 0;
  for (double local : per_thread) amax = NanMax(amax, local);
  Nvfp4Scales scales;
  scales.amax = static_cast<float>(amax);
  scales.global_scale = Nvfp4GlobalScale(amax, precision, convention);
  scales.e4m3.resize(n);
  const float g = scales.global_scale;
  uint8_t* codes = scales.e4m3.data();
  if (convention == Nvfp4Convention::kModelOpt) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) codes[i] = ModelOptBlockCode(Nvfp4BlockAmax(lo[i], hi[i]), g);
  } else {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      codes[i] = CompressedTensorsBlockCode(Nvfp4BlockAmax(lo[i], hi[i]), g, precision);
    }
  }
  return scales;
}

namespace {

// The block amax of a tensor's elements as magnitude bit patterns: for finite values
// the order of |x| is the order of the bits with the sign cleared, and any pattern at
// or above the infinity's is non-finite. Bits is the dtype's unsigned word, Real the
// type that holds P exactly.
template <typename Bits, typename Real, Bits kInfinity, typename Decode>
struct MagnitudeFormat {
  using BitsType = Bits;
  using RealType = Real;
  static constexpr Bits kMagnitudeMask = static_cast<Bits>(std::numeric_limits<Bits>::max() >> 1);
  static constexpr Bits kInfinityBits = kInfinity;
  static Real Value(Bits magnitude) { return Decode()(magnitude); }
};

struct DecodeBFloat16 {
  float operator()(uint16_t b) const { return BFloat16ToFloat(b); }
};
struct DecodeHalf {
  float operator()(uint16_t b) const { return HalfToFloat(b); }
};
struct DecodeFloat32 {
  float operator()(uint32_t b) const { return FloatFromBits(b); }
};
struct DecodeFloat64 {
  double operator()(uint64_t b) const {
    double d;
    std::memcpy(&d, &b, sizeof d);
    return d;
  }
};

// Elements, and blocks of the passes over the block amax, that a thread takes at a
// time (as the range pass's chunks).
constexpr int64_t kChunkElements = int64_t{1} << 20;
constexpr int64_t kChunkBlocks = int64_t{1} << 16;

// The magnitude bit pattern of each block's largest element into `amax` (blocks of
// `size` consecutive elements from `data`); returns the largest of them. kBlock > 0:
// the block size as a constant, so that the compiler unrolls the block's max.
template <typename Format, int64_t kBlock>
typename Format::BitsType BlockAmaxBits(const uint8_t* data, int64_t blocks, int64_t size,
                                        typename Format::BitsType* amax) {
  using Bits = typename Format::BitsType;
  if constexpr (kBlock > 0) size = kBlock;
  Bits largest = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* p = data + b * size * sizeof(Bits);
    Bits m = 0;
    for (int64_t i = 0; i < size; ++i) {
      Bits v;
      std::memcpy(&v, p + i * sizeof v, sizeof v);  // the tensor's bytes need not be aligned
      v &= Format::kMagnitudeMask;
      m = v > m ? v : m;
    }
    amax[b] = m;
    largest = m > largest ? m : largest;
  }
  return largest;
}

// The same for 16-bit formats in blocks of 16 (one AVX2 register a block), eight
// blocks at a time, folded within the 128-bit lanes and across them only once: the
// compiler's own vectorization of the loop above transposes the blocks and runs at
// a third of the read bandwidth. Magnitudes are below 0x8000, so the signed max
// orders them.
__attribute__((target("avx2"))) uint16_t BlockAmaxBits16x16Avx2(const uint8_t* data,
                                                                int64_t blocks, uint16_t* amax) {
  const __m256i mask = _mm256_set1_epi16(0x7FFF);
  // The low 16 bits of 32-bit elements 0, 2, 1, 3 of each lane into its low 8 bytes.
  const __m256i gather = _mm256_setr_epi8(0, 1, 8, 9, 4, 5, 12, 13, -1, -1, -1, -1, -1, -1, -1,
                                          -1, 0, 1, 8, 9, 4, 5, 12, 13, -1, -1, -1, -1, -1, -1,
                                          -1, -1);
  auto load = [&](int64_t k) __attribute__((target("avx2"), always_inline)) {
    return _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + 32 * k)),
                            mask);
  };
  // Blocks k and k + 1: in each lane, 32-bit elements [k, k, k + 1, k + 1] (the
  // pair's maxima over that lane's half of each block, twice).
  auto pair = [&](int64_t k) __attribute__((target("avx2"), always_inline)) {
    const __m256i v0 = load(k), v1 = load(k + 1);
    __m256i m = _mm256_max_epi16(_mm256_unpacklo_epi64(v0, v1), _mm256_unpackhi_epi64(v0, v1));
    return _mm256_max_epi16(m, _mm256_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
  };
  __m256i largest = _mm256_setzero_si256();
  int64_t b = 0;
  for (; b + 8 <= blocks; b += 8) {
    // 32-bit elements [b, b + 2, b + 1, b + 3] and [b + 4, b + 6, b + 5, b + 7].
    __m256i x = _mm256_blend_epi32(pair(b), pair(b + 2), 0xAA);
    __m256i y = _mm256_blend_epi32(pair(b + 4), pair(b + 6), 0xAA);
    x = _mm256_max_epi16(x, _mm256_srli_epi32(x, 16));
    y = _mm256_max_epi16(y, _mm256_srli_epi32(y, 16));
    // Lane 0: blocks b .. b + 3 over both halves; lane 1: b + 4 .. b + 7.
    const __m256i z = _mm256_max_epi16(_mm256_permute2x128_si256(x, y, 0x20),
                                       _mm256_permute2x128_si256(x, y, 0x31));
    largest = _mm256_max_epi16(largest, z);
    const __m256i ordered =
        _mm256_permute4x64_epi64(_mm256_shuffle_epi8(z, gather), _MM_SHUFFLE(3, 1, 2, 0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(amax + b), _mm256_castsi256_si128(ordered));
  }
  // Every 16-bit element of `largest` is some block's partial or whole max.
  alignas(32) uint16_t lanes[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), largest);
  uint16_t result = *std::max_element(lanes, lanes + 16);
  if (b < blocks) {  // the mask is all the format the loop uses
    using Any16 = MagnitudeFormat<uint16_t, float, 0x7F80, DecodeBFloat16>;
    result = std::max(result, BlockAmaxBits<Any16, kNvfp4BlockSize>(data + 32 * b, blocks - b,
                                                                     kNvfp4BlockSize, amax + b));
  }
  return result;
}

// The block code of a block whose amax has magnitude pattern `bits`.
template <typename Format>
uint8_t CodeOfBits(typename Format::BitsType bits, float g, DType precision,
                   Nvfp4Convention convention) {
  const double a = static_cast<typename Format::RealType>(Format::Value(bits));
  return convention == Nvfp4Convention::kModelOpt ? ModelOptBlockCode(a, g)
                                                  : CompressedTensorsBlockCode(a, g, precision);
}

using BFloat16Magnitude = MagnitudeFormat<uint16_t, float, 0x7F80, DecodeBFloat16>;

// codes[b] of the bfloat16 block amax magnitude bits amax[b], b < n, for P =
// bfloat16: CompressedTensorsBlockCode or ModelOptBlockCode, eight blocks a step in
// the same IEEE float operations in the same order (division, bfloat16 rounding,
// product, clamp, FloatToFloat8E4M3Fn's two roundings), so the same bits; the tail
// goes through the scalar functions. Faster than a code table's lookups.
__attribute__((target("avx2"))) void BFloat16BlockCodesAvx2(const uint16_t* amax, int64_t n,
                                                            float g, Nvfp4Convention convention,
                                                            uint8_t* codes) {
  const bool modelopt = convention == Nvfp4Convention::kModelOpt;
  const __m256 six = _mm256_set1_ps(6.0f);
  const __m256 gs = _mm256_set1_ps(g);
  const __m256 den = _mm256_set1_ps(6.0f * g);  // as ModelOptBlockCode's den
  const __m256 e4m3_max = _mm256_set1_ps(kE4M3Max);
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 zero = _mm256_setzero_ps();
  const __m256i bf16_round = _mm256_set1_epi32(0x7FFF);
  const __m256i one_i = _mm256_set1_epi32(1);
  const __m256i high16 = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const __m256i rebias = _mm256_set1_epi32(static_cast<int>(120u << 23));
  const __m256i half_ulp = _mm256_set1_epi32(0x7FFFF);
  const __m256i low8 = _mm256_set1_epi32(0xFF);
  const __m256i smallest_normal = _mm256_set1_epi32(0x3C800000);  // 2^-6
  const __m256 subnormal_shift = _mm256_set1_ps(16384.0f);
  const __m256i subnormal_base = _mm256_set1_epi32(0x46800000);
  const __m256i zero_block_code = _mm256_set1_epi32(kCompressedTensorsZeroBlockCode);
  // Byte 0 of each 32-bit element into the low four bytes of its lane.
  const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                             -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1,
                                             -1, -1, -1, -1, -1, -1);
  const __m256i lanes_together = _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1);
  int64_t b = 0;
  for (; b + 8 <= n; b += 8) {
    const __m256i bits16 =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(amax + b)));
    const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(bits16, 16));
    __m256 s;
    if (modelopt) {
      s = _mm256_div_ps(a, den);
      s = _mm256_blendv_ps(s, one, _mm256_cmp_ps(s, zero, _CMP_EQ_OQ));
    } else {
      // RoundToBFloat16(a / 6): the quotient is finite and not NaN.
      __m256i t = _mm256_castps_si256(_mm256_div_ps(a, six));
      t = _mm256_add_epi32(t, _mm256_add_epi32(bf16_round,
                                               _mm256_and_si256(_mm256_srli_epi32(t, 16), one_i)));
      s = _mm256_mul_ps(gs, _mm256_castsi256_ps(_mm256_and_si256(t, high16)));
    }
    s = _mm256_min_ps(s, e4m3_max);  // s >= 0 and not NaN: the clamp to [-448, 448]
    // FloatToFloat8E4M3Fn of 0 <= s <= 448 (never its 480-and-above branch).
    const __m256i u = _mm256_castps_si256(s);
    const __m256i subnormal =
        _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(s, subnormal_shift)), subnormal_base);
    const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 20), one_i);
    const __m256i normal = _mm256_and_si256(
        _mm256_srli_epi32(
            _mm256_add_epi32(_mm256_sub_epi32(u, rebias), _mm256_add_epi32(half_ulp, odd)), 20),
        low8);
    __m256i code = _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(smallest_normal, u));
    if (!modelopt) {
      code = _mm256_blendv_epi8(code, zero_block_code,
                                _mm256_cmpeq_epi32(code, _mm256_setzero_si256()));
    }
    const __m256i packed =
        _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(code, low_bytes), lanes_together);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + b), _mm256_castsi256_si128(packed));
  }
  for (; b < n; ++b) {
    const double a = BFloat16ToFloat(amax[b]);
    codes[b] = modelopt ? ModelOptBlockCode(a, g)
                        : CompressedTensorsBlockCode(a, g, DType::kBFloat16);
  }
}

// codes[b] of amax[b] from the table, for b < n. The pointers are parameters, and
// restrict, so that the loop keeps them in registers: as the parallel region's shared
// variables they were reloaded after every byte store, which may alias them.
template <typename Bits>
void LookUpCodes(const Bits* __restrict amax, int64_t n, const uint8_t* __restrict code_of,
                 uint8_t* __restrict codes) {
  for (int64_t b = 0; b < n; ++b) codes[b] = code_of[amax[b]];
}

// One parallel region, its phases separated by barriers rather than regions of
// their own: between two regions the other thread would spin (or sleep) through the
// serial part, and the serial parts (the codes' zero fill, the code table) cost as
// much as the lookup itself. Only the codes are written: their float values (the
// wire's QParams.scale) are decoded where they are needed (ScaleValues), which keeps
// 4 bytes a block of writes, and their zero fill, out of the pass.
template <typename Format, int64_t kBlock>
std::optional<Nvfp4Scales> TensorScales(const TensorView& x, int64_t block_size,
                                        Nvfp4Convention convention) {
  using Bits = typename Format::BitsType;
  const int64_t size = kBlock > 0 ? kBlock : block_size;
  const int64_t blocks = x.num_elements() / size;
  const uint8_t* data = x.data();
  const DType precision = x.dtype();
  // Not a vector: its zero fill would be one more pass over a fifth of the input.
  const std::unique_ptr<Bits[]> block_amax(new Bits[blocks]);
  const int threads = RangeThreadsFor(x.num_elements());
  bool avx2 = false;
  if constexpr (sizeof(Bits) == 2 && kBlock == kNvfp4BlockSize) {
    avx2 = std::min(range_internal::DetectedKernelLevel(),
                    range_internal::kernel_level_cap.load()) == range_internal::KernelLevel::kAvx2;
  }
  // A 16-bit block amax takes at most amax_bits + 1 < kInfinityBits values: when there
  // are more blocks than that, the code of each value once and a lookup a block cost
  // less than the arithmetic a block. The same function of the same amax: the same bits.
  constexpr bool kTableable = sizeof(Bits) == 2;
  // bfloat16 on the AVX2 level: the code pass in vector arithmetic instead (P is
  // bfloat16, the only precision it implements).
  bool vector_codes = false;
  if constexpr (std::is_same_v<Format, BFloat16Magnitude>) {
    vector_codes = std::min(range_internal::DetectedKernelLevel(),
                            range_internal::kernel_level_cap.load()) ==
                   range_internal::KernelLevel::kAvx2;
  }
  const size_t table_capacity = kTableable ? static_cast<size_t>(Format::kInfinityBits) : 0;
  const std::unique_ptr<uint8_t[]> code_table(new uint8_t[table_capacity]);
  // Per-thread maxima, merged by every thread after the barrier (a max is
  // commutative: the order does not matter). Slots, not a critical section: TSan's
  // OpenMP tool (Archer) crashes in __kmpc_end_critical.
  std::vector<Bits> per_thread(threads, 0);
  Nvfp4Scales scales;
  Bits amax_bits = 0;
  // Chunks first come first served, as in the range pass: a core slowed by other load
  // does not hold the other back.
  const int64_t chunk = std::max<int64_t>(1, kChunkElements / size);
  const int64_t chunks = (blocks + chunk - 1) / chunk;
#pragma omp parallel num_threads(threads)
  {
    // The codes' zero fill by the first thread here, while the other starts on the
    // amax pass; nothing touches them before the barrier.
#pragma omp single nowait
    scales.e4m3.resize(blocks);
    Bits local = 0;
#pragma omp for schedule(dynamic) nowait
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * chunk, n = std::min(chunk, blocks - begin);
      const uint8_t* p = data + begin * size * sizeof(Bits);
      Bits* out = block_amax.get() + begin;
      Bits m;
      if constexpr (sizeof(Bits) == 2 && kBlock == kNvfp4BlockSize) {
        m = avx2 ? BlockAmaxBits16x16Avx2(p, n, out) : BlockAmaxBits<Format, kBlock>(p, n, size, out);
      } else {
        m = BlockAmaxBits<Format, kBlock>(p, n, size, out);
      }
      local = m > local ? m : local;
    }
    per_thread[omp_get_thread_num()] = local;
#pragma omp barrier
    // Every thread takes the same decisions from the same slots, so that all of them
    // meet the same work-sharing loops below.
    Bits largest = 0;
    for (Bits m : per_thread) largest = m > largest ? m : largest;
    if (largest < Format::kInfinityBits) {
      const float g = Nvfp4GlobalScale(Format::Value(largest), precision, convention);
      uint8_t* codes = scales.e4m3.data();
      const Bits* a = block_amax.get();
      if (vector_codes) {
        const int64_t code_chunks = (blocks + kChunkBlocks - 1) / kChunkBlocks;
#pragma omp for schedule(static)
        for (int64_t c = 0; c < code_chunks; ++c) {
          const int64_t begin = c * kChunkBlocks;
          if constexpr (std::is_same_v<Format, BFloat16Magnitude>) {
            BFloat16BlockCodesAvx2(a + begin, std::min(kChunkBlocks, blocks - begin), g,
                                   convention, codes + begin);
          }
        }
      } else if (kTableable && blocks > static_cast<int64_t>(largest)) {
        const int64_t entries = static_cast<int64_t>(largest) + 1;
        uint8_t* code_of = code_table.get();
#pragma omp for schedule(static)
        for (int64_t v = 0; v < entries; ++v) {
          code_of[v] = CodeOfBits<Format>(static_cast<Bits>(v), g, precision, convention);
        }
        const int64_t lookup_chunks = (blocks + kChunkBlocks - 1) / kChunkBlocks;
#pragma omp for schedule(static)
        for (int64_t c = 0; c < lookup_chunks; ++c) {
          const int64_t begin = c * kChunkBlocks;
          LookUpCodes(a + begin, std::min(kChunkBlocks, blocks - begin), code_of, codes + begin);
        }
      } else {
#pragma omp for schedule(dynamic, kChunkBlocks)
        for (int64_t b = 0; b < blocks; ++b) {
          codes[b] = CodeOfBits<Format>(a[b], g, precision, convention);
        }
      }
    }
#pragma omp single nowait
    amax_bits = largest;
  }
  if (amax_bits >= Format::kInfinityBits) return std::nullopt;
  const double amax = Format::Value(amax_bits);
  scales.amax = static_cast<float>(amax);
  scales.global_scale = Nvfp4GlobalScale(amax, precision, convention);
  return scales;
}

template <typename Format>
std::optional<Nvfp4Scales> TensorScalesOf(const TensorView& x, int64_t block_size,
                                          Nvfp4Convention convention) {
  return block_size == kNvfp4BlockSize
             ? TensorScales<Format, kNvfp4BlockSize>(x, block_size, convention)
             : TensorScales<Format, 0>(x, block_size, convention);
}

}  // namespace

std::optional<Nvfp4Scales> ComputeNvfp4ScalesOfTensor(const TensorView& x, const Shape& block,
                                                      Nvfp4Convention convention) {
  const Shape& shape = x.shape();
  if (shape.empty() || block.size() != shape.size() || x.num_elements() == 0) return std::nullopt;
  for (size_t d = 0; d + 1 < block.size(); ++d) {
    if (block[d] != 1) return std::nullopt;
  }
  const int64_t size = block.back();
  if (size < 1 || shape.back() % size != 0) return std::nullopt;
  // Every block amax is max |x| of its elements: the range of a block clamped to
  // include 0 gives exactly that (§3.1).
  switch (x.dtype()) {
    case DType::kBFloat16:
      return TensorScalesOf<MagnitudeFormat<uint16_t, float, 0x7F80, DecodeBFloat16>>(x, size,
                                                                                     convention);
    case DType::kFloat16:
      return TensorScalesOf<MagnitudeFormat<uint16_t, float, 0x7C00, DecodeHalf>>(x, size,
                                                                                 convention);
    case DType::kFloat32:
      return TensorScalesOf<MagnitudeFormat<uint32_t, float, 0x7F800000u, DecodeFloat32>>(
          x, size, convention);
    case DType::kFloat64:
      return TensorScalesOf<
          MagnitudeFormat<uint64_t, double, 0x7FF0000000000000ull, DecodeFloat64>>(x, size,
                                                                                   convention);
  }
  return std::nullopt;
}

namespace {

// The e2m1 magnitudes at nibble indices 0-7.
constexpr float kE2M1Magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// Round to nearest even among the e2m1 magnitudes, saturating at 6: the thresholds of
// compressed-tensors' cast_to_fp4, equal to ModelOpt's searchsorted with its +1 at
// 0.75, 1.75 and 3.5. NaN gives 7, as searchsorted sorts NaN last.
int E2M1Index(float magnitude) {
  if (magnitude <= 0.25f) return 0;
  if (magnitude < 0.75f) return 1;
  if (magnitude <= 1.25f) return 2;
  if (magnitude < 1.75f) return 3;
  if (magnitude <= 2.5f) return 4;
  if (magnitude < 3.5f) return 5;
  if (magnitude <= 5.0f) return 6;
  return 7;
}

absl::Status CheckQuantizable(const TensorView& x) {
  if (x.shape().empty() || x.shape().back() % kNvfp4BlockSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.shape ", ShapeString(x.shape()),
        ": NVFP4 quantization needs a last dim that is a multiple of ", kNvfp4BlockSize));
  }
  for (int64_t i = 0; i < x.num_elements(); ++i) {
    if (!std::isfinite(x.ValueAt(i))) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor[", i, "] is ", x.ValueAt(i), "; NVFP4 quantizes finite values"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> Nvfp4DynamicBlockCodes(const TensorView& x, float global_scale,
                                                            Nvfp4Convention convention) {
  QPARAMS_RETURN_IF_ERROR(CheckQuantizable(x));
  std::vector<uint8_t> codes(x.num_elements() / kNvfp4BlockSize);
  for (size_t b = 0; b < codes.size(); ++b) {
    double amax = 0;
    for (int64_t i = 0; i < kNvfp4BlockSize; ++i) {
      amax = std::max(amax, std::fabs(x.ValueAt(b * kNvfp4BlockSize + i)));
    }
    codes[b] = Nvfp4BlockScaleCode(amax, global_scale, x.dtype(), convention);
  }
  return codes;
}

absl::StatusOr<Nvfp4QuantizedTensor> Nvfp4QuantizeDequantize(
    const TensorView& x, const std::vector<uint8_t>& block_codes, float global_scale,
    Nvfp4Convention convention) {
  QPARAMS_RETURN_IF_ERROR(CheckQuantizable(x));
  const int64_t n = x.num_elements();
  if (static_cast<int64_t>(block_codes.size()) != n / kNvfp4BlockSize) {
    return absl::InvalidArgumentError(absl::StrCat("block_codes holds ", block_codes.size(),
                                                   " codes; the tensor has ", n / kNvfp4BlockSize,
                                                   " blocks of 16"));
  }
  const bool modelopt = convention == Nvfp4Convention::kModelOpt;
  Nvfp4QuantizedTensor out;
  out.packed.assign(n / 2, 0);
  out.dequantized.resize(n);
  for (int64_t i = 0; i < n; ++i) {
    const float code_value = Float8E4M3FnToFloat(block_codes[i / kNvfp4BlockSize]);
    const float d = modelopt ? code_value * global_scale : code_value / global_scale;
    float y = static_cast<float>(x.ValueAt(i)) / d;
    if (!modelopt) y = std::clamp(y, -6.0f, 6.0f);  // ModelOpt does not clamp
    const int index = E2M1Index(std::fabs(y));
    const bool negative = y < 0;  // -0.0 gives nibble 0x0, NaN 0x7
    const uint8_t nibble = static_cast<uint8_t>((negative ? 8 : 0) | index);
    out.packed[i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? nibble : nibble << 4);
    // Nibble 0x8 is -0.0 in compressed-tensors and +0.0 in ModelOpt's e2m1_values.
    float v = negative ? -kE2M1Magnitudes[index] : kE2M1Magnitudes[index];
    if (nibble == 0x8 && modelopt) v = 0.0f;
    out.dequantized[i] = v * d;
  }
  return out;
}

}  // namespace qparams
