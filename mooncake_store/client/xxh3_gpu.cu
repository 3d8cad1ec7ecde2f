/* The object checksum's chunk digests on the GPU: XXH3-64 (seed 0) of every 1 MiB chunk of a
 * device buffer (docs/CHECKSUM.md, "On the GPU"; reference: common/xxh3_blocks.py).
 *
 * Two kernels, both over a buffer of `n` bytes cut into chunks of CHUNK_BYTES (the last one may
 * be shorter):
 *   xxh3_block_sums: one thread per (chunk, block slot, lane): the sum over the slot's stripes
 *     of what each adds to accumulator `lane` (XXH3's stripes only add; no term depends on the
 *     accumulators).  Writes sums[(chunk * SLOTS + slot) * 8 + lane].  Memory-bound, every
 *     block and lane in parallel.
 *   xxh3_finish: eight threads per chunk, one per lane (lanes never mix before the merge): the
 *     scan over the chunk's full blocks (add the sum, scramble; the sums are loaded SCAN_BATCH
 *     at a time so the loads overlap), the partial block's sum and the last stripe; then the
 *     lanes meet (warp shuffles) and the chunk's first thread merges them and runs the
 *     avalanche.  Writes digests[chunk]; a chunk of <= 240 bytes (XXH3's short paths) gets 0
 *     and is hashed by the host from its bytes.
 *
 * The secret (XXH3's default 192 bytes) is passed in by the caller, who owns the only copy
 * (common/xxh3_blocks.SECRET).
 *
 * The same file compiles as plain C (gcc -x c): the device qualifiers become `static inline`
 * and xxh3_block_sums_grid / xxh3_finish_grid run the kernels' threads in a loop over the same
 * grid (a chunk's eight lane threads one after the other, then its merge, where the GPU
 * shuffles), so the arithmetic and the indexing are tested on a host without a GPU
 * (tests/unit/test_xxh3_gpu.py).  No header is included: NVRTC (cupy.RawModule) has none.
 */

#if defined(__CUDACC__) || defined(__CUDACC_RTC__) /* nvcc, or NVRTC (cupy.RawModule) */
#define XXH_CUDA 1
#endif

#ifdef XXH_CUDA
#define XXH_DEV __device__ __forceinline__
#define XXH_KERNEL extern "C" __global__
#define XXH_UNROLL _Pragma("unroll")
#else
#define XXH_UNROLL
#define XXH_DEV static inline
#define XXH_KERNEL
#endif

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

#define CHUNK_BYTES 1048576ULL
#define SLOTS 1024ULL /* block slots per chunk: 1023 full blocks and the partial one */
#define STRIPE 64ULL
#define STRIPES_PER_BLOCK 16ULL
#define BLOCK 1024ULL
#define MIDSIZE_MAX 240ULL
#define SECRET_BYTES 192ULL
#define LASTACC_START 7ULL
#define MERGEACCS_START 11ULL
#define SCAN_BATCH 32 /* block sums loaded ahead by one lane's scan */

#define PRIME32_1 0x9E3779B1ULL
#define PRIME32_2 0x85EBCA77ULL
#define PRIME32_3 0xC2B2AE3DULL
#define PRIME64_1 0x9E3779B185EBCA87ULL
#define PRIME64_2 0xC2B2AE3D27D4EB4FULL
#define PRIME64_3 0x165667B19E3779F9ULL
#define PRIME64_4 0x85EBCA77C2B2AE63ULL
#define PRIME64_5 0x27D4EB2F165667C5ULL
#define PRIME_MX1 0x165667919E3779F9ULL

XXH_DEV u64 read_le64(const u8 *p) {
#ifdef XXH_CUDA
    if ((((u64)p) & 7ULL) == 0) return *(const u64 *)p; /* the GPU is little-endian */
    u64 v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | (u64)p[i];
    return v;
#else
    u64 v; /* a little-endian host (x86-64, aarch64): what the tests run on */
    __builtin_memcpy(&v, p, 8);
    return v;
#endif
}

XXH_DEV u64 mul128_fold64(u64 a, u64 b) {
#ifdef XXH_CUDA
    return (a * b) ^ __umul64hi(a, b);
#else
    unsigned __int128 product = (unsigned __int128)a * b;
    return (u64)product ^ (u64)(product >> 64);
#endif
}

XXH_DEV u64 min_u64(u64 a, u64 b) { return a < b ? a : b; }

/* What one stripe adds to accumulator `lane`: its neighbour's 8 bytes, and the product of the
 * two halves of its own 8 bytes xor the key. */
XXH_DEV u64 lane_term(const u8 *stripe, const u8 *key, u64 lane) {
    u64 swapped = read_le64(stripe + 8 * (lane ^ 1));
    u64 keyed = read_le64(stripe + 8 * lane) ^ read_le64(key + 8 * lane);
    return swapped + (keyed & 0xFFFFFFFFULL) * (keyed >> 32);
}

XXH_DEV u64 scramble(u64 acc, u64 key) {
    acc ^= acc >> 47;
    acc ^= key;
    return acc * PRIME32_1;
}

XXH_DEV u64 avalanche(u64 h) {
    h ^= h >> 37;
    h *= PRIME_MX1;
    return h ^ (h >> 32);
}

XXH_DEV void block_sums_thread(u64 gid, const u8 *data, u64 n, const u8 *secret, u64 *sums) {
    u64 lane = gid & 7ULL;
    u64 slot_global = gid >> 3;
    u64 chunk = slot_global / SLOTS;
    u64 slot = slot_global % SLOTS;
    u64 start = chunk * CHUNK_BYTES;
    if (start >= n) return;
    u64 length = min_u64(CHUNK_BYTES, n - start);
    u64 sum = 0;
    if (length > MIDSIZE_MAX) {
        u64 stripes = (length - 1) / STRIPE; /* the last stripe is added by xxh3_finish */
        u64 first = slot * STRIPES_PER_BLOCK;
        for (u64 s = 0; s < STRIPES_PER_BLOCK && first + s < stripes; ++s)
            sum += lane_term(data + start + (first + s) * STRIPE, secret + 8 * s, lane);
    }
    sums[slot_global * 8 + lane] = sum;
}

XXH_DEV u64 chunk_length(u64 chunk, u64 n) {
    u64 start = chunk * CHUNK_BYTES;
    return start >= n ? 0 : min_u64(CHUNK_BYTES, n - start);
}

/* Accumulator `lane` of a chunk of `length` (> 240) bytes, up to the merge. */
XXH_DEV u64 scan_lane(u64 chunk, u64 lane, u64 length, const u8 *data, const u8 *secret,
                      const u64 *sums) {
    u64 acc = lane == 0 ? PRIME32_3 : lane == 1 ? PRIME64_1 : lane == 2 ? PRIME64_2
            : lane == 3 ? PRIME64_3 : lane == 4 ? PRIME64_4 : lane == 5 ? PRIME32_2
            : lane == 6 ? PRIME64_5 : PRIME32_1; /* XXH3's initial accumulators */
    u64 key = read_le64(secret + SECRET_BYTES - STRIPE + 8 * lane);
    const u64 *sum = sums + chunk * SLOTS * 8 + lane; /* slot b's sum is sum[8 * b] */
    u64 full = (length - 1) / BLOCK;
    u64 b = 0;
    for (; b + SCAN_BATCH <= full; b += SCAN_BATCH) {
        u64 batch[SCAN_BATCH];
        XXH_UNROLL
        for (int i = 0; i < SCAN_BATCH; ++i) batch[i] = sum[8 * (b + i)];
        XXH_UNROLL
        for (int i = 0; i < SCAN_BATCH; ++i) acc = scramble(acc + batch[i], key);
    }
    for (; b < full; ++b) acc = scramble(acc + sum[8 * b], key);
    const u8 *last = data + chunk * CHUNK_BYTES + length - STRIPE;
    const u8 *last_key = secret + SECRET_BYTES - STRIPE - LASTACC_START;
    return acc + sum[8 * full] + lane_term(last, last_key, lane);
}

XXH_DEV u64 merge_lanes(const u64 *acc, u64 length, const u8 *secret) {
    u64 result = length * PRIME64_1;
    const u8 *merge = secret + MERGEACCS_START;
    for (u64 i = 0; i < 4; ++i)
        result += mul128_fold64(acc[2 * i] ^ read_le64(merge + 16 * i),
                                acc[2 * i + 1] ^ read_le64(merge + 16 * i + 8));
    return avalanche(result);
}

#ifdef XXH_CUDA

XXH_KERNEL void xxh3_block_sums(const u8 *data, u64 n, const u8 *secret, u64 *sums) {
    u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    block_sums_thread(gid, data, n, secret, sums);
}

/* blockDim.x must be a multiple of 8, so a chunk's eight lanes share a warp. */
XXH_KERNEL void xxh3_finish(const u8 *data, u64 n, const u8 *secret, const u64 *sums,
                            u64 *digests) {
    u64 gid = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 chunk = gid >> 3, lane = gid & 7ULL;
    u64 length = chunk_length(chunk, n);
    u64 mine = length > MIDSIZE_MAX ? scan_lane(chunk, lane, length, data, secret, sums) : 0;
    u64 acc[8];
    unsigned first = threadIdx.x & ~7U; /* every thread of the warp takes part */
    for (int j = 0; j < 8; ++j) acc[j] = __shfl_sync(0xFFFFFFFFU, mine, (int)(first + j) & 31);
    if (lane == 0 && length > 0)
        digests[chunk] = length > MIDSIZE_MAX ? merge_lanes(acc, length, secret) : 0;
}

#else /* the host build: the kernels' threads, one after the other */

void xxh3_block_sums_grid(u32 grid, u32 block, const u8 *data, u64 n, const u8 *secret,
                          u64 *sums) {
    for (u64 gid = 0; gid < (u64)grid * block; ++gid)
        block_sums_thread(gid, data, n, secret, sums);
}

void xxh3_finish_grid(u32 grid, u32 block, const u8 *data, u64 n, const u8 *secret,
                      const u64 *sums, u64 *digests) {
    for (u64 chunk = 0; chunk < ((u64)grid * block) >> 3; ++chunk) {
        u64 length = chunk_length(chunk, n);
        if (length == 0) continue;
        if (length <= MIDSIZE_MAX) {
            digests[chunk] = 0;
            continue;
        }
        u64 acc[8];
        for (u64 lane = 0; lane < 8; ++lane)
            acc[lane] = scan_lane(chunk, lane, length, data, secret, sums);
        digests[chunk] = merge_lanes(acc, length, secret);
    }
}

#endif
