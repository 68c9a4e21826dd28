// The FP8 expert block's gate/up GEMM for Hopper (sm_90a) as a CUDA kernel, for the mid-size batches
// (about 100-400 rows per expert) where the Triton kernel (engine/kernels/moe_fp8_triton.py) reads each
// weight tile once per 128-row tile: here two CTAs of a cluster take an expert's two 128-row tiles and
// share its weight tile, each loading half of it through TMA and multicasting it to both.
//
// Same contract and arithmetic as _moe_gate_up_fp8_kernel with a 256-row, 128-column-group tile:
//   q[r, n] = e4m3(silu(g) * u * routing weight / s[r, n / 128]) for the sorted pair r of expert e,
//   g = x[tok(r)] . W[e, 2 n] * x_scale[tok] * w_scale[e, 2 n], u likewise with row 2 n + 1,
//   s[r, b] = max(amax of the row's 128 channels of block b, 1e-12) / 448.
// x (T, H) e4m3 rows, one float32 scale per token; W (E, 2I, H) e4m3 with gate and up rows interleaved,
// one float32 scale per expert and row; order (S,) int32 pair ids sorted by expert, counts (E,) int32;
// top_w (T k,) float32; out q (S, I) e4m3 and qs (S, I / 128) float32, rows in expert order.
//
// Roles (384 threads, one CTA per SM): warpgroup 0 loads (each thread gathers 16-byte pieces of 8 rows
// with cp.async into the 128-byte-swizzled layout the tensor cores read; thread 0 also issues the TMA of
// this CTA's half of the weight tile, multicast to the cluster); warpgroups 1 and 2 each multiply 64 rows by
// the 256 weight rows with wgmma (m64n256k32, both operands from shared memory) and run the epilogue.
// A stage is free again when the consumers of both CTAs have released it (the "empty" barrier counts
// four arrivals), since the peer's TMA writes into this CTA's shared memory too.
//
// The grid is static (CUDA-graph capturable): x runs over an upper bound of the 256-row pair tiles
// (two CTAs each), y over the 128-channel column blocks; clusters past the last pair tile exit at once.

#include "moe_gate_up_fp8_sm90.h"

#include <cuda_fp8.h>

namespace {

using clef::kBlockK;
using clef::kBlockM;
using clef::kBlockN;
using clef::kGroup;
constexpr int kStages = 4;
constexpr int kABytes = kBlockM * kBlockK;
constexpr int kBBytes = kBlockN * kBlockK;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kThreads = 384;
constexpr int kSmemBytes = kStages * kStageBytes + 1024;  // + room to align the stages to 1024 bytes
constexpr float kFp8Max = 448.0f;

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    while (!done) {
        asm volatile(
            "{\n\t.reg .pred p;\n\t"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
            "selp.u32 %0, 1, 0, p;\n\t}"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}

// Arrive on the barrier at the same shared-memory offset in CTA `cta` of this cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
    asm volatile(
        "{\n\t.reg .b32 remote;\n\t"
        "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
        "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n\t}" ::"r"(bar),
        "r"(cta)
        : "memory");
}

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

// One arrival on `bar` once every cp.async this thread issued so far has landed.
__device__ __forceinline__ void cp_async_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// A (1, 128, 128) box of the (E, 2I, H) weights at (expert, row, k) into `dst` of every CTA of the
// cluster, each CTA's barrier at `bar`'s offset counting the bytes.
__device__ __forceinline__ void tma_load_multicast(
    uint32_t dst, const CUtensorMap* map, uint32_t bar, int k, int row, int expert) {
    const uint16_t mask = 0x3;
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4, %5}], [%2], %6;" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(k), "r"(row), "r"(expert), "h"(mask)
        : "memory");
}

// wgmma shared-memory descriptor of a K-major tile in the 128-byte swizzle: 8-row groups 1024 bytes apart.
__device__ __forceinline__ uint64_t smem_desc(uint32_t addr) {
    uint64_t d = static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
    d |= static_cast<uint64_t>(1) << 16;            // leading byte offset (unused by this layout)
    d |= static_cast<uint64_t>(1024 >> 4) << 32;    // stride byte offset
    d |= static_cast<uint64_t>(1) << 62;            // 128-byte swizzle
    return d;
}

__device__ __forceinline__ void fence_operands(float (&d)[128]) {
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (64 x 256 float32, wgmma's fragment) += A (64 x 32 e4m3) . B (256 x 32 e4m3)^T, or = when !accumulate.
__device__ __forceinline__ void wgmma_64x256x32(float (&d)[128], uint64_t a, uint64_t b, uint32_t accumulate) {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "setp.ne.b32 p, %130, 0;\n\t"
        "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, %128, %129, p, 1, 1;\n\t}"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
          "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
          "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(a), "l"(b), "r"(accumulate));
}

struct Tile {
    int expert;   // >= experts: past the last pair tile
    int row0;     // first sorted row of the pair tile
    int row_end;  // end row of the expert
};

// The pair tile `p` (256 sorted rows of one expert) by a scan of the per-expert pair-tile counts; warp 0.
__device__ Tile find_tile(const int* __restrict__ counts, int experts, int p) {
    const int lane = threadIdx.x & 31;
    int carry_tiles = 0, carry_rows = 0;
    for (int base = 0; base < experts; base += 32) {
        const int e = base + lane;
        const int c = e < experts ? counts[e] : 0;
        const int t = (c + 2 * kBlockM - 1) / (2 * kBlockM);
        int tiles = t, rows = c;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, tiles, off);
            const int b = __shfl_up_sync(0xffffffffu, rows, off);
            if (lane >= off) {
                tiles += a;
                rows += b;
            }
        }
        const int tile_end = carry_tiles + tiles, row_end = carry_rows + rows;
        const unsigned hit = __ballot_sync(0xffffffffu, p >= tile_end - t && p < tile_end);
        if (hit) {
            const int src = __ffs(hit) - 1;
            const int first = __shfl_sync(0xffffffffu, tile_end - t, src);
            const int end = __shfl_sync(0xffffffffu, row_end, src);
            const int count = __shfl_sync(0xffffffffu, c, src);
            return Tile{base + src, end - count + (p - first) * 2 * kBlockM, end};
        }
        carry_tiles = __shfl_sync(0xffffffffu, tile_end, 31);
        carry_rows = __shfl_sync(0xffffffffu, row_end, 31);
    }
    return Tile{experts, 0, 0};
}

__global__ void __launch_bounds__(kThreads, 1) gate_up_fp8_kernel(
    const __grid_constant__ CUtensorMap w_map,
    const uint8_t* __restrict__ x,
    const float* __restrict__ x_scale,
    const float* __restrict__ w_scale,
    const int* __restrict__ order,
    const int* __restrict__ counts,
    const float* __restrict__ top_w,
    uint8_t* __restrict__ q,
    float* __restrict__ q_scale,
    int hidden,
    int inter,
    int experts,
    int top_k) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_bar[kStages];
    __shared__ __align__(8) uint64_t empty_bar[kStages];
    __shared__ Tile tile;

    const int tid = threadIdx.x;
    const uint32_t rank = cluster_rank();
    const int nblk = blockIdx.y;
    if (tid < 32) {
        const Tile t = find_tile(counts, experts, static_cast<int>(blockIdx.x >> 1));
        if (tid == 0) tile = t;
    }
    __syncthreads();
    const int expert = tile.expert;
    if (expert >= experts) return;  // both CTAs of the cluster see the same pair tile
    const int row0 = tile.row0 + static_cast<int>(rank) * kBlockM;
    const int row_end = tile.row_end;

    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t stages = (raw + 1023u) & ~1023u;
    uint8_t* const stages_ptr = smem_raw + (stages - raw);
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(smem_addr(&full_bar[s]), kBlockM + 1);  // every loader thread, + thread 0's expect_tx
            mbar_init(smem_addr(&empty_bar[s]), 4);           // 2 consumer warpgroups x 2 CTAs
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cluster_sync();

    const int ksteps = hidden / kBlockK;
    if (tid < 128) {
        // Loader: thread tid gathers 16-byte piece (tid % 8) of rows tid / 8 + 16 i.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        const int piece = tid & 7, r_first = tid >> 3;
        const uint32_t swz = static_cast<uint32_t>((piece ^ (r_first & 7)) << 4);
        uint32_t src[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int row = row0 + r_first + 16 * i;
            src[i] = row < row_end
                ? static_cast<uint32_t>(order[row] / top_k) * static_cast<uint32_t>(hidden) + piece * 16
                : 0xFFFFFFFFu;
        }
        for (int it = 0; it < ksteps; ++it) {
            const int s = it % kStages;
            const uint32_t phase = (it / kStages) & 1;
            const uint32_t full = smem_addr(&full_bar[s]);
            mbar_wait(smem_addr(&empty_bar[s]), phase ^ 1);
            const uint32_t a_dst = stages + s * kStageBytes;
            if (tid == 0) {
                mbar_expect_tx(full, kBBytes);
                tma_load_multicast(a_dst + kABytes + rank * (kBBytes / 2), &w_map, full, it * kBlockK,
                                   nblk * kBlockN + static_cast<int>(rank) * (kBlockN / 2), expert);
            }
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                if (src[i] != 0xFFFFFFFFu) {
                    cp_async_16(a_dst + (r_first + 16 * i) * kBlockK + swz, x + src[i] + it * kBlockK);
                }
            }
            cp_async_arrive(full);
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
        const int wg = (tid - 128) >> 7;  // rows 64 wg .. 64 wg + 63 of the tile
        const int t = tid & 127;
        float d[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) d[i] = 0.0f;
        fence_operands(d);
        for (int it = 0; it < ksteps; ++it) {
            const int s = it % kStages;
            mbar_wait(smem_addr(&full_bar[s]), (it / kStages) & 1);
            // the loaders' cp.async writes (generic proxy) before the tensor cores' reads (async proxy)
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            const uint32_t a = stages + s * kStageBytes + wg * 64 * kBlockK;
            const uint32_t b = stages + s * kStageBytes + kABytes;
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < kBlockK / 32; ++kk) {
                wgmma_64x256x32(d, smem_desc(a + kk * 32), smem_desc(b + kk * 32), (it > 0 || kk > 0) ? 1u : 0u);
            }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            if (it > 0 && t == 0) {  // the previous step's products are done: its stage is free
                const uint32_t prev = smem_addr(&empty_bar[(it - 1) % kStages]);
                mbar_arrive_cluster(prev, 0);
                mbar_arrive_cluster(prev, 1);
            }
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
        fence_operands(d);

        // Epilogue. Fragment: thread t holds rows 16 (t / 32) + (t % 32) / 4 + 8 h, columns
        // 8 j + 2 (t % 4) + c as d[4 j + 2 h + c]; c = 0 is a gate row, c = 1 its up row (channel 4 j + t % 4).
        const int warp = t >> 5, lane = t & 31, quad = lane & 3;
        const float* ws = w_scale + static_cast<int64_t>(expert) * 2 * inter + nblk * kBlockN;
        uint8_t* const out_tile = stages_ptr + wg * 64 * kBlockK;  // stage 0's A rows of this warpgroup
        const int groups = inter / kGroup;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = 16 * warp + (lane >> 2) + 8 * h;  // row within the warpgroup's 64
            const int row = row0 + wg * 64 + r;
            const bool ok = row < row_end;
            const int pair = ok ? order[row] : 0;
            const float xs = ok ? x_scale[pair / top_k] : 0.0f;
            const float rw = ok ? top_w[pair] : 0.0f;
            float amax = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const int col = 8 * j + 2 * quad;
                const float g = d[4 * j + 2 * h] * xs * ws[col];
                const float u = d[4 * j + 2 * h + 1] * xs * ws[col + 1];
                const float act = g / (1.0f + __expf(-g)) * u * rw;
                d[4 * j + 2 * h] = act;
                amax = fmaxf(amax, fabsf(act));
            }
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
            const float scale = fmaxf(amax, 1e-12f) / kFp8Max;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const int ch = 4 * j + quad;
                const __nv_fp8_storage_t v = __nv_cvt_float_to_fp8(d[4 * j + 2 * h] / scale, __NV_SATFINITE, __NV_E4M3);
                out_tile[r * kBlockK + (ch ^ ((r & 7) << 4))] = v;
            }
            if (ok && quad == 0) q_scale[static_cast<int64_t>(row) * groups + nblk] = scale;
        }
        asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int piece_id = t + 128 * i;
            const int r = piece_id >> 3, piece = piece_id & 7;
            const int row = row0 + wg * 64 + r;
            if (row < row_end) {
                const uint4 v = *reinterpret_cast<const uint4*>(out_tile + r * kBlockK + ((piece ^ (r & 7)) << 4));
                *reinterpret_cast<uint4*>(q + static_cast<int64_t>(row) * inter + nblk * kGroup + piece * 16) = v;
            }
        }
    }
    cluster_sync();  // no CTA leaves while its peer may still write into its shared memory or barriers
}

}  // namespace

cudaError_t clef::launch_gate_up_fp8(const CUtensorMap& w_map, const GateUpArgs& a, cudaStream_t stream) {
    static bool configured = false;
    if (!configured) {
        const cudaError_t err =
            cudaFuncSetAttribute(gate_up_fp8_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
        if (err != cudaSuccess) return err;
        configured = true;
    }
    const int64_t pair_tiles = (a.pairs + int64_t{a.experts} * (2 * kBlockM - 1)) / (2 * kBlockM);  // upper bound
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(2 * pair_tiles), static_cast<unsigned>(a.inter / kGroup), 1);
    cfg.blockDim = dim3(kThreads, 1, 1);
    cfg.dynamicSmemBytes = kSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, gate_up_fp8_kernel, w_map, a.x, a.x_scale, a.w_scale, a.order, a.counts,
                              a.top_w, a.q, a.q_scale, a.hidden, a.inter, a.experts, a.top_k);
}
