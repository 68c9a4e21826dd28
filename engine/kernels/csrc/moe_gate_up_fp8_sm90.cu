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
// Work items are (256-row pair tile, 128-channel column block) over a static upper bound of the pair tiles
// (moe_fp8_sm90.h); the launch runs as many clusters as fit, or as many as asked, each looping over its items
// and stopping at the first past the last pair tile. The grid depends on the sizes only (CUDA-graph capturable).

#include <cuda_fp8.h>

#include "sm90_common.cuh"

namespace {

using namespace clef;  // NOLINT: the helpers and tile constants of sm90_common.cuh

constexpr int kStages = 4;
constexpr int kABytes = kItemRows * kBlockK;
constexpr int kRowsPerLoader = kItemRows / 16;  // rows each loader thread gathers (16 threads a row)
constexpr int kBBytes = kBlockN * kBlockK;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kThreads = 384;
constexpr int kSmemBytes = kStages * kStageBytes + kBlockM * kBlockK + 1024;  // stages, staging, alignment
constexpr float kFp8Max = 448.0f;

// One item's epilogue inputs for a multiplier thread's two rows (h = 0, 1), read ahead of its k loop
// (multiply_items' prefetch): the pair ids at once, their token scales and routing weights at `midway`.
struct RowInputs {
    const float* x_scale;
    const float* top_w;
    int top_k;
    int pair[2];
    bool ok[2];
    float xs[2], rw[2];

    __device__ __forceinline__ void midway() {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            xs[h] = ok[h] ? x_scale[pair[h] / top_k] : 0.0f;
            rw[h] = ok[h] ? top_w[pair[h]] : 0.0f;
        }
    }
};

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
    int top_k,
    int work,
    bool solo,
    int ablate) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_bar[kStages];
    __shared__ __align__(8) uint64_t empty_bar[kStages];
    __shared__ TileTable tiles;
    __shared__ __align__(8) uint64_t turn_bar[2];  // ping-pong: turn_bar[w] completes when the other warpgroup's
                                                   // k loop ends
    __shared__ __align__(16) float col_scales[2][kBlockN];  // each multiplier warpgroup's copy of w_scale's
                                                            // 256 values of its item

    const int tid = threadIdx.x;
    const uint32_t my_rank = solo ? 0u : cluster_rank();
    const Share mine = share(solo, work);
    const int nblocks = inter / kGroup;
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t stages = (raw + 1023u) & ~1023u;
    uint8_t* const staging = smem_raw + (stages - raw) + kStages * kStageBytes;  // the output tile, 16 KB
    // full: every loader thread's cp.async arrival, + thread 0's expect_tx
    if (tid >= 32 && tid < 64) build_tile_table<kPairRows>(counts, experts, tiles);  // warp 1, while thread 0 sets up
    if (kPingPong && tid == 0) {
        mbar_init(smem_addr(&turn_bar[0]), 1);
        mbar_init(smem_addr(&turn_bar[1]), 1);
    }
    // the stages' readers: both multiplier warpgroups, or one
    init_stage_barriers<kStages>(full_bar, empty_bar, kBlockM + 1, solo, kPingPong ? 1 : 2);

    const int ksteps = hidden / kBlockK;
    // Work item w: pair tile w / nblocks, column block w % nblocks. Pair tiles past the last one end the loop
    // (w only grows), for every warp of both CTAs alike.
    if (tid < 128) {
        // Loader: thread tid gathers 16-byte piece (tid % 8) of rows tid / 8 + 16 i, i < kRowsPerLoader.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        const int piece = tid & 7, r_first = tid >> 3;
        const uint32_t swz = static_cast<uint32_t>((piece ^ (r_first & 7)) << 4);
        int it = 0;  // pipeline step, across work items
        for (int v = mine.first; v < mine.items; v += mine.stride) {
            const Item item = item_at<kPairRows>(v, solo, my_rank, nblocks, tiles, experts);
            if (item.tile.expert >= experts) break;
            if (item.empty) continue;
            const Tile& tile = item.tile;
            const int row0 = item.row0;
            uint32_t src[kRowsPerLoader];
#pragma unroll
            for (int i = 0; i < kRowsPerLoader; ++i) {
                const int row = row0 + r_first + 16 * i;
                src[i] = row < tile.row_end
                    ? static_cast<uint32_t>(order[row] / top_k) * static_cast<uint32_t>(hidden) + piece * 16
                    : 0xFFFFFFFFu;
            }
            for (int ks = 0; ks < ksteps; ++ks, ++it) {
                const int s = it % kStages;
                const uint32_t full = smem_addr(&full_bar[s]);
                mbar_wait(smem_addr(&empty_bar[s]), ((it / kStages) & 1) ^ 1);
                const uint32_t a_dst = stages + s * kStageBytes;
                if (tid == 0) {
                    mbar_expect_tx(full, ablate == 2 ? 0 : kBBytes);
                    if (ablate != 2) {
                        load_weight_tile(a_dst + kABytes, &w_map, full, ks, item.nblk, tile.expert, solo, my_rank);
                    }
                }
#pragma unroll
                for (int i = 0; i < kRowsPerLoader; ++i) {
                    if (ablate != 2 && src[i] != 0xFFFFFFFFu) {
                        cp_async_16(a_dst + (r_first + 16 * i) * kBlockK + swz, x + src[i] + ks * kBlockK);
                    }
                }
                cp_async_arrive(full);
            }
        }
    } else {
        const auto prefetch = [&](const Item& item, int wg, int t) {
                prefetch_scales(col_scales[wg], w_scale + static_cast<int64_t>(item.tile.expert) * 2 * inter +
                                                    item.nblk * kBlockN, t);
                RowInputs in{x_scale, top_w, top_k, {0, 0}, {false, false}, {0.0f, 0.0f}, {0.0f, 0.0f}};
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = item.row0 + (kPingPong ? 0 : wg * 64) + 16 * (t >> 5) + ((t & 31) >> 2) + 8 * h;
                    in.ok[h] = row < item.tile.row_end;
                    in.pair[h] = in.ok[h] ? order[row] : 0;
                }
                return in;
            };
        const auto epilogue = [&](const Item& item, float(&d)[128], int wg, int t, const RowInputs& in) {
            const int warp = t >> 5, lane = t & 31, quad = lane & 3;
            uint8_t* const out_tile = staging + wg * 64 * kBlockK;
            const Tile& tile = item.tile;
            const int first = item.row0 + (kPingPong ? 0 : wg * 64), nblk = item.nblk;  // this warpgroup's 64 rows
            // Epilogue. Fragment: thread t holds rows 16 (t / 32) + (t % 32) / 4 + 8 h, columns
            // 8 j + 2 (t % 4) + c as d[4 j + 2 h + c]; c = 0 is a gate row, c = 1 its up row (channel 4 j + t % 4).
            const float* ws = col_scales[wg];
            scales_ready();
            // the last item's staging is read; this item's column scales are in
            asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
            int rows[2];
            float amax[2] = {0.0f, 0.0f};
#pragma unroll
            for (int h = 0; h < 2; ++h) rows[h] = 16 * warp + (lane >> 2) + 8 * h;  // row within the warpgroup's 64
            const float* xs = in.xs;
            const float* rw = in.rw;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const int col = 8 * j + 2 * quad;
                const float wg_ = ws[col], wu = ws[col + 1];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const float g = d[4 * j + 2 * h] * xs[h] * wg_;
                    const float u = d[4 * j + 2 * h + 1] * xs[h] * wu;
                    const float act = div_full(g, 1.0f + __expf(-g)) * u * rw[h];
                    d[4 * j + 2 * h] = act;  // the gate slot holds the activation from here on
                    amax[h] = fmaxf(amax[h], fabsf(act));
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float m = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
                m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
                const float scale = div_full(fmaxf(m, 1e-12f), kFp8Max);
                const int r = rows[h];
#pragma unroll
                for (int j = 0; j < 32; ++j) {
                    const int ch = 4 * j + quad;
                    out_tile[r * kBlockK + (ch ^ ((r & 7) << 4))] =
                        __nv_cvt_float_to_fp8(div_full(d[4 * j + 2 * h], scale), __NV_SATFINITE, __NV_E4M3);
                }
                const int row = first + r;
                if (row < tile.row_end && quad == 0) q_scale[static_cast<int64_t>(row) * nblocks + nblk] = scale;
            }
            asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int piece_id = t + 128 * i;
                const int r = piece_id >> 3, piece = piece_id & 7;
                const int row = first + r;
                if (row < tile.row_end) {
                    const uint4 v = *reinterpret_cast<const uint4*>(out_tile + r * kBlockK + ((piece ^ (r & 7)) << 4));
                    *reinterpret_cast<uint4*>(q + static_cast<int64_t>(row) * inter + nblk * kGroup + piece * 16) = v;
                }
            }
            };
        multiply_items<kStages, kStageBytes, kABytes>(mine, solo, my_rank, nblocks, tiles, experts, stages, full_bar,
                                                      empty_bar, turn_bar, ksteps, ablate, true, prefetch, epilogue);
    }
    cluster_sync();  // no CTA leaves while its peer may still write into its shared memory or barriers
}

}  // namespace

namespace {
int gate_up_fit = 0;  // two-CTA clusters of gate_up_fp8_kernel resident at once, queried on first use
}  // namespace

cudaError_t clef::gate_up_fp8_clusters(int* fit) {
    const cudaError_t err = clusters_fit_of(gate_up_fp8_kernel, kThreads, kSmemBytes, &gate_up_fit);
    *fit = gate_up_fit;
    return err;
}

cudaError_t clef::launch_gate_up_fp8(const CUtensorMap& w_map, const GateUpArgs& a, cudaStream_t stream) {
    return launch_items<kPairRows>(gate_up_fp8_kernel, kThreads, kSmemBytes, &gate_up_fit, a.pairs, a.experts,
                                   a.inter / kGroup, a.clusters, a.solo, a.ablate, stream, w_map, a.x, a.x_scale,
                                   a.w_scale, a.order, a.counts, a.top_w, a.q, a.q_scale, a.hidden, a.inter,
                                   a.experts, a.top_k);
}
