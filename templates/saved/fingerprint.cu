// The saved-tensor check's fingerprint on a CUDA device, compiled at run time by NVRTC and launched
// from C++ (cuda_launch.cpp): one kernel per saved tensor at save, and at use one for all the tensors a
// backward node saved (at most 16 a launch), reading their bytes in place.
//
// The fingerprint of a byte stream B (a tensor's bytes: in memory order when its elements fill one
// block of memory, else its elements with its dimensions taken by decreasing stride) is
//     sum over NH blocks j of  W(j) * NH(block j)      mod 2**64
// where a block is 256 little-endian 32-bit words of B (the last one padded with zero words),
//     NH(block) = sum over i < 128 of (w[2i] + K[2i] mod 2**32) * (w[2i+1] + K[2i+1] mod 2**32)
// (K: 256 random words of the process's key) and W(j) is an odd 64-bit weight made from the key's
// seed and j. The same number as the CPU's (fingerprint.cpp) and the Python fallback's.
//
// Each warp reads NH blocks (each lane 8 words of each), each lane adds W(j) times its share of
// NH(block j) (the sum distributes), and a block of threads adds its warps' totals and its own atomically
// into the launch's slot (slot[0]). A launch that compares (expect != 0, at use) counts its blocks of
// threads done in slot[1], and the last one writes a flag into host memory if the total differs from the
// fingerprint made when the tensor was saved (where one block of threads reads the tensor, it compares).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef long long i64;

#define MAX_DIMS 8

struct Layout {
  i64 size[MAX_DIMS];
  i64 stride[MAX_DIMS];  // in elements
  int dims;
  int element;  // bytes per element: 1, 2, 4, 8 or 16
};

__device__ __forceinline__ u64 block_weight(u64 seed, u64 j) {
  u64 z = seed + (j + 1ull) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return (z ^ (z >> 31)) | 1ull;
}

__device__ __forceinline__ u64 pair(u32 a, u32 b, u32 ka, u32 kb) {
  return (u64)(a + ka) * (u64)(b + kb);
}

// Word i of a block of nbytes bytes at base (bytes past the end read as zero).
__device__ __forceinline__ u32 dense_word(const unsigned char* base, u64 nbytes, u64 i, bool aligned) {
  u64 at = i * 4ull;
  if (aligned && at + 4ull <= nbytes) return *(const u32*)(base + at);
  u32 w = 0;
  for (int b = 0; b < 4; ++b)
    if (at + b < nbytes) w |= (u32)base[at + b] << (8 * b);
  return w;
}

// The whole 1 KiB blocks at the start of the block of memory that can be read 16 bytes at a time (0 if unaligned).
__device__ __forceinline__ u64 aligned_blocks(const unsigned char* base, u64 nbytes) {
  return ((u64)base & 15ull) == 0ull ? nbytes / 1024ull : 0ull;
}

// `blocks`: the blocks of threads that read this tensor (a launch of one tensor: gridDim.x). The block's
// warps add their totals in shared memory, and one atomic add a block puts the block's total into the slot
// (one a warp queued thousands of adds on one address at the end of every launch).
__device__ __forceinline__ void finish(u64 acc, u64* slot, const u64* expect, u64 record,
                                       volatile unsigned char* flags, u64 cap, volatile u32* any, u64 blocks) {
  __shared__ u64 warp_total[32];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) warp_total[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    u64 total = 0;
    for (unsigned w = 0; w < (blockDim.x >> 5); ++w) total += warp_total[w];
    if (expect == 0) {  // a fingerprint made at save: its total is read later, in stream order
      atomicAdd(slot, total);
      return;
    }
    if (blocks == 1ull) {  // the whole tensor read here: no other block to wait for (a small tensor)
      slot[0] = total;
      slot[1] = 1ull;
      if (total != *expect) {
        flags[record % cap] = 1;
        *any = 1u;
        __threadfence_system();
      }
      return;
    }
    atomicAdd(slot, total);
    __threadfence();
    u64 done = atomicAdd(slot + 1, 1ull);
    if (done == blocks - 1ull && expect != 0) {
      __threadfence();
      u64 sum = atomicAdd(slot, 0ull);
      if (sum != *expect) {
        flags[record % cap] = 1;
        *any = 1u;
        __threadfence_system();
      }
    }
  }
}

// 16 bytes at p, read once (streaming: the check's reads should not push the program's data out of the caches).
__device__ __forceinline__ uint4 load_once(const unsigned char* p) {
  uint4 v;
  asm volatile("ld.global.cs.v4.u32 { %0, %1, %2, %3 }, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

__device__ __forceinline__ u64 share_of(uint4 a, uint4 b, const u32* k) {
  return pair(a.x, a.y, k[0], k[1]) + pair(a.z, a.w, k[2], k[3]) + pair(b.x, b.y, k[4], k[5]) +
         pair(b.z, b.w, k[6], k[7]);
}

// Lane l of a warp reads words 4l .. 4l+3 and 128+4l .. 128+4l+3 of a block: two loads of 16 bytes, each
// warp-wide load 512 bytes one after another.
__device__ __forceinline__ u64 dense_share(const unsigned char* base, u64 nbytes, u64 j, int lane, const u32* k,
                                           bool aligned) {
  const u64 at = j * 1024ull + (u64)lane * 16ull;
  if (aligned && j * 1024ull + 1024ull <= nbytes) return share_of(load_once(base + at), load_once(base + at + 512ull), k);
  bool four = ((u64)base & 3ull) == 0ull;
  uint4 a, b;
  a.x = dense_word(base, nbytes, (at >> 2) + 0, four);
  a.y = dense_word(base, nbytes, (at >> 2) + 1, four);
  a.z = dense_word(base, nbytes, (at >> 2) + 2, four);
  a.w = dense_word(base, nbytes, (at >> 2) + 3, four);
  b.x = dense_word(base, nbytes, ((at + 512ull) >> 2) + 0, four);
  b.y = dense_word(base, nbytes, ((at + 512ull) >> 2) + 1, four);
  b.z = dense_word(base, nbytes, ((at + 512ull) >> 2) + 2, four);
  b.w = dense_word(base, nbytes, ((at + 512ull) >> 2) + 3, four);
  return share_of(a, b, k);
}

// A lane's share of a tensor's fingerprint, read by block `block` of `readers` blocks of threads.
// The whole aligned blocks four a turn (eight loads in flight a lane; the last turn's loads only where its
// blocks exist, so a warp with fewer than four blocks left still reads them all at once), then the rest
// (a last, partial block; every block where the tensor is not 16-byte aligned) one at a time.
__device__ __forceinline__ u64 dense_sum(const unsigned char* base, u64 nbytes, const u32* key, u64 seed, u64 block,
                                         u64 readers) {
  const int lane = threadIdx.x & 31;
  const u64 warps = readers * (blockDim.x >> 5);
  const u64 words = (nbytes + 3ull) / 4ull;
  const u64 blocks = (words + 255ull) / 256ull;
  const u64 whole = aligned_blocks(base, nbytes);
  u32 k[8];
  for (int i = 0; i < 4; ++i) {
    k[i] = key[lane * 4 + i];
    k[4 + i] = key[128 + lane * 4 + i];
  }
  u64 acc = 0;
  const u64 first = block * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const u64 step = warps * 1024ull;
  for (u64 j = first; j < whole; j += 4ull * warps) {
    const unsigned char* p = base + j * 1024ull + (u64)lane * 16ull;
    uint4 a[4], b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      a[u] = b[u] = make_uint4(0, 0, 0, 0);
      if (j + (u64)u * warps < whole) {
        a[u] = load_once(p + (u64)u * step);
        b[u] = load_once(p + (u64)u * step + 512ull);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (j + (u64)u * warps < whole) acc += block_weight(seed, j + (u64)u * warps) * share_of(a[u], b[u], k);
  }
  const bool aligned = ((u64)base & 15ull) == 0ull;
  for (u64 j = whole + first; j < blocks; j += warps)
    acc += block_weight(seed, j) * dense_share(base, nbytes, j, lane, k, aligned);
  return acc;
}

extern "C" __global__ void fingerprint_dense(const unsigned char* base, u64 nbytes, const u32* key, u64 seed,
                                             u64* slot, const u64* expect, u64 record, unsigned char* flags,
                                             u64 cap, u32* any) {
  finish(dense_sum(base, nbytes, key, seed, blockIdx.x, gridDim.x), slot, expect, record, flags, cap, any, gridDim.x);
}

// One element's e bytes at element offset off (e <= 4), as the low bytes of a word.
__device__ __forceinline__ u32 element_bits(const unsigned char* base, i64 off, int e) {
  const unsigned char* p = base + off * e;
  if (e == 4) return *(const u32*)p;
  if (e == 2) return (u32)(*(const unsigned short*)p);
  return (u32)(*p);
}

// The elements of a strided tensor in the order of its Layout (by decreasing stride), walked from a linear index.
struct Walk {
  i64 index[MAX_DIMS];
  i64 offset;
  __device__ void start(const Layout& l, i64 linear) {
    offset = 0;
    for (int d = l.dims - 1; d >= 0; --d) {
      i64 s = l.size[d];
      index[d] = linear % s;
      linear /= s;
      offset += index[d] * l.stride[d];
    }
  }
  __device__ void next(const Layout& l) {
    for (int d = l.dims - 1; d >= 0; --d) {
      offset += l.stride[d];
      if (++index[d] < l.size[d]) return;
      offset -= index[d] * l.stride[d];
      index[d] = 0;
    }
  }
};

__device__ __forceinline__ u64 strided_sum(const unsigned char* base, const Layout& l, i64 numel, const u32* key,
                                           u64 seed, u64 block, u64 readers) {
  const int lane = threadIdx.x & 31;
  const u64 warps = readers * (blockDim.x >> 5);
  const int e = l.element;
  const u64 words = e >= 4 ? (u64)numel * (u64)(e / 4) : ((u64)numel * (u64)e + 3ull) / 4ull;
  const u64 blocks = (words + 255ull) / 256ull;
  u32 k[8];
  for (int i = 0; i < 8; ++i) k[i] = key[lane * 8 + i];
  u64 acc = 0;
  for (u64 j = block * (blockDim.x >> 5) + (threadIdx.x >> 5); j < blocks; j += warps) {
    u64 first = j * 256ull + (u64)lane * 8ull;  // this lane's first word
    u32 w[8];
    Walk walk;
    if (e >= 4) {
      const int per = e / 4;  // words per element
      i64 element = (i64)(first / per);
      int part = (int)(first % per);
      walk.start(l, element < numel ? element : 0);
      for (int i = 0; i < 8; ++i) {
        w[i] = element < numel ? *(const u32*)(base + walk.offset * e + part * 4) : 0u;
        if (++part == per) {
          part = 0;
          if (++element < numel) walk.next(l);
        }
      }
    } else {
      const int per = 4 / e;  // elements per word
      i64 element = (i64)(first * per);
      walk.start(l, element < numel ? element : 0);
      for (int i = 0; i < 8; ++i) {
        u32 word = 0;
        for (int s = 0; s < per; ++s) {
          if (element < numel) {
            word |= element_bits(base, walk.offset, e) << (8 * e * s);
            if (++element < numel) walk.next(l);
          }
        }
        w[i] = word;
      }
    }
    u64 p = pair(w[0], w[1], k[0], k[1]) + pair(w[2], w[3], k[2], k[3]) + pair(w[4], w[5], k[4], k[5]) +
            pair(w[6], w[7], k[6], k[7]);
    acc += block_weight(seed, j) * p;
  }
  return acc;
}

extern "C" __global__ void fingerprint_strided(const unsigned char* base, Layout l, i64 numel, const u32* key,
                                               u64 seed, u64* slot, const u64* expect, u64 record,
                                               unsigned char* flags, u64 cap, u32* any) {
  finish(strided_sum(base, l, numel, key, seed, blockIdx.x, gridDim.x), slot, expect, record, flags, cap, any,
         gridDim.x);
}

// A tensor whose innermost dimension is contiguous, its rows (runs along it) a multiple of 16 bytes long and
// starting at addresses that are multiples of 16 (a head of a fused projection, a slice of columns): each
// 16 bytes of the stream lie in one row, and lane l reads them as the dense kernel does (one load each).
// The row of a 16-byte group: one division by the row's length, then one per outer dimension. Where the
// tensor has fewer than 2**31 elements (and reaches less than 2**31 elements from its start), in 32 bits,
// each division a multiplication and a shift by numbers made once a block of threads (Granlund and
// Montgomery: for n < 2**31, n / d = (n * m) >> (31 + l) with l = ceil(log2 d), m = ceil(2**(31 + l) / d));
// else in 64-bit divisions.
struct Divisor {
  u32 m, shift;
};

__device__ __forceinline__ Divisor divisor_of(u64 d) {
  if (d == 0ull) return Divisor{0u, 0u};
  int l = 0;
  while ((1ull << l) < d) ++l;
  return Divisor{(u32)(((1ull << (31 + l)) + d - 1ull) / d), (u32)(31 + l)};
}

__device__ __forceinline__ u32 divide(u32 n, u32, const Divisor* v, int k) {
  return (u32)(((u64)n * (u64)v[k].m) >> v[k].shift);
}
__device__ __forceinline__ u64 divide(u64 n, u64 d, const Divisor*, int) { return n / d; }

template <typename I>
__device__ __forceinline__ const unsigned char* row_group(const unsigned char* base, const Layout& l, u64 group,
                                                          u64 nbytes, int element_shift, const Divisor* div) {
  if (group * 16ull >= nbytes) return 0;
  const int d = l.dims - 1;
  I element = (I)((group * 16ull) >> element_shift);
  I row = element, offset = element;  // offset in elements
  if (d >= 1) {
    row = divide(element, (I)l.size[d], div, d);
    offset = element - row * (I)l.size[d];
    for (int k = d - 1; k >= 1; --k) {
      I outer = divide(row, (I)l.size[k], div, k);
      offset += (row - outer * (I)l.size[k]) * (I)l.stride[k];
      row = outer;
    }
    offset += row * (I)l.stride[0];  // row < size[0]: the element is in the tensor
  }
  return base + (u64)offset * (u64)l.element;
}

// Four blocks a turn (eight loads in flight a lane), the last turn's loads only where its blocks exist.
template <typename I>
__device__ __forceinline__ u64 rows_loop(const unsigned char* base, const Layout& l, u64 nbytes, const u32* k,
                                         u64 seed, u64 first, u64 warps, int lane, const Divisor* div) {
  const u64 blocks = (nbytes + 1023ull) / 1024ull;
  const int element_shift = __ffs(l.element) - 1;
  u64 acc = 0;
  for (u64 j = first; j < blocks; j += 4ull * warps) {
    uint4 a[4], b[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      a[u] = b[u] = make_uint4(0, 0, 0, 0);
      const u64 at = j + (u64)u * warps;
      if (at < blocks) {
        const unsigned char* p = row_group<I>(base, l, at * 64ull + (u64)lane, nbytes, element_shift, div);
        const unsigned char* q = row_group<I>(base, l, at * 64ull + 32ull + (u64)lane, nbytes, element_shift, div);
        if (p) a[u] = load_once(p);
        if (q) b[u] = load_once(q);
      }
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const u64 at = j + (u64)u * warps;
      if (at < blocks) acc += block_weight(seed, at) * share_of(a[u], b[u], k);
    }
  }
  return acc;
}

// Called by every thread of a block (it waits for the block's divisors).
__device__ __forceinline__ u64 rows_sum(const unsigned char* base, const Layout& l, u64 nbytes, int small,
                                        const u32* key, u64 seed, u64 block, u64 readers) {
  __shared__ Divisor div[MAX_DIMS];
  if (small && threadIdx.x < (unsigned)l.dims) div[threadIdx.x] = divisor_of((u64)l.size[threadIdx.x]);
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const u64 warps = readers * (blockDim.x >> 5);
  u32 k[8];
  for (int i = 0; i < 4; ++i) {
    k[i] = key[lane * 4 + i];
    k[4 + i] = key[128 + lane * 4 + i];
  }
  const u64 first = block * (blockDim.x >> 5) + (threadIdx.x >> 5);
  return small ? rows_loop<u32>(base, l, nbytes, k, seed, first, warps, lane, div)
               : rows_loop<u64>(base, l, nbytes, k, seed, first, warps, lane, div);
}

extern "C" __global__ void fingerprint_rows(const unsigned char* base, Layout l, u64 nbytes, int small,
                                            const u32* key, u64 seed, u64* slot, const u64* expect, u64 record,
                                            unsigned char* flags, u64 cap, u32* any) {
  finish(rows_sum(base, l, nbytes, small, key, seed, blockIdx.x, gridDim.x), slot, expect, record, flags, cap, any,
         gridDim.x);
}

// Several tensors in one launch (at use, the tensors one backward node saved): each tensor's blocks of threads
// one after another, each block finding its tensor from where the tensors' blocks start, each tensor summed,
// compared and flagged as its own launch would do it.
#define MAX_BATCH 16

struct Item {
  const unsigned char* base;
  u64 nbytes;
  i64 numel;
  u64* slot;
  const u64* expect;
  u64 record;
  u32 first, blocks;  // its blocks of threads: first .. first + blocks - 1
  int kind;           // 0 dense, 1 rows, 2 strided
  int small;          // rows: 32-bit offsets
  Layout l;
};

struct Batch {
  Item item[MAX_BATCH];
  int n;
};
static_assert(sizeof(Item) == 200 && sizeof(Batch) == 3208, "Item and Batch are launch.h's");

extern "C" __global__ void fingerprint_batch(Batch b, const u32* key, u64 seed, unsigned char* flags, u64 cap,
                                             u32* any) {
  int i = 0;
  while (i + 1 < b.n && blockIdx.x >= b.item[i + 1].first) ++i;
  const Item& t = b.item[i];
  const u64 block = blockIdx.x - t.first;
  u64 acc;
  if (t.kind == 0)
    acc = dense_sum(t.base, t.nbytes, key, seed, block, t.blocks);
  else if (t.kind == 1)
    acc = rows_sum(t.base, t.l, t.nbytes, t.small, key, seed, block, t.blocks);
  else
    acc = strided_sum(t.base, t.l, t.numel, key, seed, block, t.blocks);
  finish(acc, t.slot, t.expect, t.record, flags, cap, any, t.blocks);
}
