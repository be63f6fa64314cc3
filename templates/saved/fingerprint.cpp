// The saved-tensor check's key and CPU fingerprint: NH blocks summed with odd weights, vectorized where the
// CPU has AVX2, on torch's intra-op threads; a strided tensor's elements gathered a block at a time.

#include "fingerprint.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TGP_X86 1
#endif

namespace torchgen_patch_saved __attribute__((visibility("hidden"))) {

Key key;
bool keyed = false;

inline u64 block_weight(u64 j) {
  u64 z = key.seed + (j + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) | 1ull;
}

static u64 nh_scalar(const unsigned char* bytes) {
  u32 w[kWords];
  std::memcpy(w, bytes, kBlockBytes);
  u64 s = 0;
  for (int i = 0; i < kWords; i += 2) s += (u64)(u32)(w[i] + key.nh[i]) * (u64)(u32)(w[i + 1] + key.nh[i + 1]);
  return s;
}

#ifdef TGP_X86
static __attribute__((target("avx2"))) u64 nh_avx2(const unsigned char* bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  const __m256i* k = reinterpret_cast<const __m256i*>(key.nh);
  for (int i = 0; i < kWords / 8; i += 2) {
    __m256i x = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes) + i),
                                 _mm256_loadu_si256(k + i));
    __m256i y = _mm256_add_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes) + i + 1),
                                 _mm256_loadu_si256(k + i + 1));
    a0 = _mm256_add_epi64(a0, _mm256_mul_epu32(x, _mm256_srli_epi64(x, 32)));
    a1 = _mm256_add_epi64(a1, _mm256_mul_epu32(y, _mm256_srli_epi64(y, 32)));
  }
  alignas(32) u64 lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(a0, a1));
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

using NhFn = u64 (*)(const unsigned char*);
static NhFn nh = nh_scalar;
const char* nh_name = "scalar";

void choose_nh() {
#ifdef TGP_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) {
    nh = nh_avx2;
    nh_name = "avx2";
  }
#endif
}

constexpr int64_t kGrain = 256;  // NH blocks per task of torch's intra-op threads (256 KiB)

// The fingerprint of nbytes of memory at p, read in place (the last partial block copied and padded).
u64 fingerprint_block(const unsigned char* p, int64_t nbytes) {
  const int64_t full = nbytes / kBlockBytes;
  std::atomic<u64> total{0};
  at::parallel_for(0, full, kGrain, [&](int64_t b0, int64_t b1) {
    u64 s = 0;
    for (int64_t j = b0; j < b1; ++j) s += block_weight((u64)j) * nh(p + j * kBlockBytes);
    total.fetch_add(s, std::memory_order_relaxed);
  });
  u64 sum = total.load();
  int64_t rest = nbytes - full * kBlockBytes;
  if (rest) {
    unsigned char last[kBlockBytes] = {0};
    std::memcpy(last, p + full * kBlockBytes, (size_t)rest);
    sum += block_weight((u64)full) * nh(last);
  }
  return sum;
}

// t's dimensions by decreasing stride (of equal strides, the first first),
// sizes of one dropped and neighbours that are contiguous with each other merged; false where more than
// kMaxDims remain (or t has more than 64 dimensions).
bool collapse(const at::Tensor& t, Layout& l) {
  l.element = (int)t.element_size();
  l.dims = 0;
  if (t.dim() > 64) return false;
  int64_t size[64], stride[64];
  int n = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {  // insertion by decreasing stride, after any of an equal one
    if (t.size(d) == 1) continue;
    int at = n++;
    for (; at > 0 && stride[at - 1] < t.stride(d); --at) {
      size[at] = size[at - 1];
      stride[at] = stride[at - 1];
    }
    size[at] = t.size(d);
    stride[at] = t.stride(d);
  }
  for (int i = 0; i < n; ++i) {
    const int64_t s = size[i], st = stride[i];
    if (l.dims && l.stride[l.dims - 1] == st * s) {
      l.size[l.dims - 1] *= s;
      l.stride[l.dims - 1] = st;
      continue;
    }
    if (l.dims == kMaxDims) return false;
    l.size[l.dims] = s;
    l.stride[l.dims] = st;
    ++l.dims;
  }
  if (!l.dims) {
    l.size[0] = 1;
    l.stride[0] = 1;
    l.dims = 1;
  }
  return true;
}

// The elements of a strided tensor in the order of its Layout (by decreasing stride), from a linear index
// (as the CUDA kernel walks them).
struct Walk {
  int64_t index[kMaxDims];
  int64_t offset = 0;
  void start(const Layout& l, int64_t linear) {
    offset = 0;
    for (int d = l.dims - 1; d >= 0; --d) {
      index[d] = linear % l.size[d];
      linear /= l.size[d];
      offset += index[d] * l.stride[d];
    }
  }
  // elements left in the innermost run from here
  int64_t run(const Layout& l) const { return l.size[l.dims - 1] - index[l.dims - 1]; }
  void advance(const Layout& l, int64_t n) {  // n elements on, n <= run(l)
    offset += n * l.stride[l.dims - 1];
    index[l.dims - 1] += n;
    if (index[l.dims - 1] < l.size[l.dims - 1]) return;
    offset -= index[l.dims - 1] * l.stride[l.dims - 1];
    index[l.dims - 1] = 0;
    for (int d = l.dims - 2; d >= 0; --d) {
      offset += l.stride[d];
      if (++index[d] < l.size[d]) return;
      offset -= index[d] * l.stride[d];
      index[d] = 0;
    }
  }
};

template <int E>
void gather_n(unsigned char* dst, const unsigned char* base, int64_t offset, int64_t stride, int64_t n) {
  const unsigned char* src = base + offset * E;
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * E, src + i * stride * E, E);
}

// n elements of e bytes, stride elements apart from element offset of base, one after another into dst.
static void gather(unsigned char* dst, const unsigned char* base, int64_t offset, int64_t stride, int64_t n, int e) {
  switch (e) {
    case 1: return gather_n<1>(dst, base, offset, stride, n);
    case 2: return gather_n<2>(dst, base, offset, stride, n);
    case 4: return gather_n<4>(dst, base, offset, stride, n);
    case 8: return gather_n<8>(dst, base, offset, stride, n);
    default: return gather_n<16>(dst, base, offset, stride, n);
  }
}

// The fingerprint of a tensor whose elements leave gaps: its elements in l's order (by decreasing stride),
// gathered a block at a time into a buffer on the stack (never a copy of the tensor).
u64 fingerprint_strided(const unsigned char* base, const Layout& l, int64_t numel) {
  const int e = l.element;
  const int64_t per_block = kBlockBytes / e;
  const int64_t blocks = (numel + per_block - 1) / per_block;
  const bool inner_contiguous = l.stride[l.dims - 1] == 1;
  std::atomic<u64> total{0};
  at::parallel_for(0, blocks, kGrain / 4, [&](int64_t b0, int64_t b1) {
    u64 s = 0;
    Walk w;
    w.start(l, b0 * per_block);
    alignas(32) unsigned char buf[kBlockBytes];
    for (int64_t j = b0; j < b1; ++j) {
      int64_t n = std::min(per_block, numel - j * per_block), filled = 0;
      if (n < per_block) std::memset(buf, 0, sizeof buf);
      while (filled < n) {
        int64_t take = std::min(w.run(l), n - filled);
        if (inner_contiguous) {
          std::memcpy(buf + filled * e, base + w.offset * e, (size_t)(take * e));
          w.advance(l, take);
          filled += take;
        } else {
          gather(buf + filled * e, base, w.offset, l.stride[l.dims - 1], take, e);
          w.advance(l, take);
          filled += take;
        }
      }
      s += block_weight((u64)j) * nh(buf);
    }
    total.fetch_add(s, std::memory_order_relaxed);
  });
  return total.load();
}

// Whether t's elements fill one block of memory exactly, in some order of its dimensions.
bool dense(const at::Tensor& t) {
  if (t.is_contiguous()) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) != 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  int64_t expect = 1;
  for (auto& [stride, size] : dims) {
    if (stride != expect) return false;
    expect *= size;
  }
  return true;
}

// Every element lies inside the storage (a storage resized to 0 between uses, as FSDP does, is not).
bool readable(const at::Tensor& t) {
  if (!t.numel()) return true;  // nothing to read
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) < 0) return false;
    last += (t.size(d) - 1) * t.stride(d);
  }
  return (int64_t)((last + 1) * t.element_size()) <= (int64_t)t.storage().nbytes();
}

}  // namespace torchgen_patch_saved
