// The FP8 expert block's down GEMM for Hopper (sm_90a) as a CUDA kernel, the companion of
// moe_gate_up_fp8_sm90.cu: two CTAs of a cluster take an expert's two 128-row tiles and share its weight tile
// (each loads half through TMA and multicasts it to both).
//
// Same contract and arithmetic as _moe_down_fp8_kernel with scaling "row_pass":
//   y[pair(r), n] = bf16((q[r] . W[e, n]) * row_scale[r] * w_scale[e, n]) for the sorted pair r of expert e,
// q (S, I) e4m3 rows in expert order requantised to one float32 scale per row (row_scale, floored at 1e-30),
// W (E, H, I) e4m3 with one float32 scale per expert and output channel; y (S, H) bf16 in pair order.
//
// Roles (384 threads, one CTA per SM): thread 0 issues the TMA loads (the activation tile, and this CTA's half
// of the weight tile multicast to the cluster); warpgroups 1 and 2 each multiply 64 rows by the 256 weight
// rows with wgmma (m64n256k32) and store their rows through shared memory in 16-byte pieces. Rows of the tile
// past the expert's end belong to the next expert (or are zero-filled past S) and are never stored.

#include "sm90_common.cuh"

namespace {

using namespace clef;  // NOLINT: the helpers and tile constants of sm90_common.cuh

constexpr int kStages = 3;
constexpr int kABytes = kItemRows * kBlockK;
constexpr int kBBytes = kBlockN * kBlockK;
constexpr int kStageBytes = kABytes + kBBytes;
constexpr int kThreads = 384;
constexpr int kRowBytes = kBlockN * 2;  // one bf16 output row of the tile

// Built with CLEF_SM90_BULK_STORE=1 (`moe_fp8_sm90.build(..., variant="bulk_store")`, benches), each output row
// leaves shared memory by one bulk async copy (512 bytes, issued by one thread of the warpgroup per row) instead
// of the multipliers' 16-byte stores, so the warpgroup goes on to its next item while the rows are written. Its
// staged rows are unswizzled and padded to kStagedRowBytes (16 bytes more: the fragment's writes then fall in
// 32 distinct banks) so that a row is contiguous there as in y.
#ifndef CLEF_SM90_BULK_STORE
#define CLEF_SM90_BULK_STORE 0
#endif
constexpr bool kBulkStore = CLEF_SM90_BULK_STORE != 0;
constexpr int kStagedRowBytes = kBulkStore ? kRowBytes + 16 : kRowBytes;
constexpr int kSmemBytes = kStages * kStageBytes + kBlockM * kStagedRowBytes + 1024;  // stages, staging, alignment

// One item's epilogue inputs for a multiplier thread, read ahead of its k loop (multiply_items' prefetch):
// the row scales of its two fragment rows (h = 0, 1) and the pair ids of the 16 rows it stores (t / 32 + 4 i;
// -1 past the expert's end). Nothing waits on an earlier load, so `midway` has nothing to do.
struct RowInputs {
    float rs[2];
    int pair[16];

    __device__ __forceinline__ void midway() {}
};

__global__ void __launch_bounds__(kThreads, 1) down_fp8_kernel(
    const __grid_constant__ CUtensorMap a_map,
    const __grid_constant__ CUtensorMap w_map,
    const float* __restrict__ row_scale,
    const float* __restrict__ w_scale,
    const int* __restrict__ order,
    const int* __restrict__ counts,
    __nv_bfloat16* __restrict__ y,
    int hidden,
    int inter,
    int experts,
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
    const int nblocks = hidden / kBlockN;
    const uint32_t raw = smem_addr(smem_raw);
    const uint32_t stages = (raw + 1023u) & ~1023u;
    uint8_t* const staging = smem_raw + (stages - raw) + kStages * kStageBytes;  // the output tile, 64 KB
    if (tid >= 32 && tid < 64) build_tile_table<kPairRows>(counts, experts, tiles);  // warp 1, while thread 0 sets up
    if (kPingPong && tid == 0) {
        mbar_init(smem_addr(&turn_bar[0]), 1);
        mbar_init(smem_addr(&turn_bar[1]), 1);
    }
    // thread 0's expect_tx (the bytes do the rest); the stages' readers: both multiplier warpgroups, or one
    init_stage_barriers<kStages>(full_bar, empty_bar, 1, solo, kPingPong ? 1 : 2);

    const int ksteps = inter / kBlockK;
    // Work item w: pair tile w / nblocks, column block w % nblocks; pair tiles past the last one end the loop.
    if (tid < 128) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (tid < 32) {  // warp 0 finds the tiles, its first lane issues the loads
            int it = 0;
            for (int v = mine.first; v < mine.items; v += mine.stride) {
                const Item item = item_at<kPairRows>(v, solo, my_rank, nblocks, tiles, experts);
                if (item.tile.expert >= experts) break;
                if (item.empty) continue;
                for (int ks = 0; ks < ksteps; ++ks, ++it) {
                    const int s = it % kStages;
                    if (tid == 0) {
                        const uint32_t full = smem_addr(&full_bar[s]);
                        mbar_wait(smem_addr(&empty_bar[s]), ((it / kStages) & 1) ^ 1);
                        const uint32_t a_dst = stages + s * kStageBytes;
                        mbar_expect_tx(full, ablate == 2 ? 0 : kABytes + kBBytes);
                        if (ablate != 2) {
                            tma_load_2d(a_dst, &a_map, full, ks * kBlockK, item.row0);
                            load_weight_tile(a_dst + kABytes, &w_map, full, ks, item.nblk, item.tile.expert, solo,
                                             my_rank);
                        }
                    }
                }
                __syncwarp();
            }
        }
    } else {
        const auto prefetch = [&](const Item& item, int wg, int t) {
                prefetch_scales(col_scales[wg], w_scale + static_cast<int64_t>(item.tile.expert) * hidden +
                                                    item.nblk * kBlockN, t);
                RowInputs in;
                const int first = item.row0 + (kPingPong ? 0 : wg * 64);  // this warpgroup's 64 rows
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int row = first + 16 * (t >> 5) + ((t & 31) >> 2) + 8 * h;
                    in.rs[h] = row < item.tile.row_end ? fmaxf(row_scale[row], 1e-30f) : 0.0f;
                }
                if constexpr (kBulkStore) {  // thread t < 64 copies row t out
                    in.pair[0] = t < 64 && first + t < item.tile.row_end ? order[first + t] : -1;
                } else {
#pragma unroll
                    for (int i = 0; i < 16; ++i) {
                        const int row = first + (t >> 5) + 4 * i;
                        in.pair[i] = row < item.tile.row_end ? order[row] : -1;
                    }
                }
                return in;
            };
        const auto epilogue = [&](const Item& item, float(&d)[128], int wg, int t, const RowInputs& in) {
            const int warp = t >> 5, lane = t & 31, quad = lane & 3;
            uint8_t* const out_tile = staging + wg * 64 * kStagedRowBytes;
            const int nblk = item.nblk;
            // Fragment: thread t holds rows 16 (t / 32) + (t % 32) / 4 + 8 h, columns 8 j + 2 (t % 4) + c as
            // d[4 j + 2 h + c]. Staged rows are 512 bytes, their 16-byte pieces swizzled by the row's low bits.
            const float* ws = col_scales[wg];
            scales_ready();
            if constexpr (kBulkStore) bulk_copies_read();  // this thread's copies of the last item's rows
            // the last item's staging is read; this item's column scales are in
            asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
            const float* rs = in.rs;
#pragma unroll
            for (int j = 0; j < 32; ++j) {
                const int col = 8 * j + 2 * quad;
                const float w0 = ws[col], w1 = ws[col + 1];
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = 16 * warp + (lane >> 2) + 8 * h;
                    const __nv_bfloat162 v =
                        __floats2bfloat162_rn(d[4 * j + 2 * h] * rs[h] * w0, d[4 * j + 2 * h + 1] * rs[h] * w1);
                    const int piece = kBulkStore ? j : j ^ (r & 7);  // bulk copies read rows in order
                    *reinterpret_cast<__nv_bfloat162*>(out_tile + r * kStagedRowBytes + (piece << 4) + 4 * quad) = v;
                }
            }
            if constexpr (kBulkStore) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // the rows, to the bulk copies
                asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
                if (in.pair[0] >= 0) {
                    bulk_copy_to_global(y + static_cast<int64_t>(in.pair[0]) * hidden + nblk * kBlockN,
                                        out_tile + t * kStagedRowBytes, kRowBytes);
                }
                return;
            }
            asm volatile("bar.sync %0, 128;" ::"r"(1 + wg) : "memory");
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const int piece_id = t + 128 * i;
                const int r = piece_id >> 5, piece = piece_id & 31;  // r = t / 32 + 4 i: in.pair[i]'s row
                if (in.pair[i] >= 0) {
                    const int64_t pair = in.pair[i];
                    const uint4 v = *reinterpret_cast<const uint4*>(out_tile + r * kRowBytes + ((piece ^ (r & 7)) << 4));
                    *reinterpret_cast<uint4*>(y + pair * hidden + nblk * kBlockN + piece * 8) = v;
                }
            }
            };
        multiply_items<kStages, kStageBytes, kABytes>(mine, solo, my_rank, nblocks, tiles, experts, stages, full_bar,
                                                      empty_bar, turn_bar, ksteps, ablate, false, prefetch, epilogue);
    }
    if constexpr (kBulkStore) bulk_copies_done();  // the last rows are written before the kernel ends
    cluster_sync();  // no CTA leaves while its peer may still write into its shared memory or barriers
}

}  // namespace

namespace {
int down_fit = 0;  // two-CTA clusters of down_fp8_kernel resident at once, queried on first use
}  // namespace

cudaError_t clef::down_fp8_clusters(int* fit) {
    const cudaError_t err = clusters_fit_of(down_fp8_kernel, kThreads, kSmemBytes, &down_fit);
    *fit = down_fit;
    return err;
}

cudaError_t clef::launch_down_fp8(const CUtensorMap& a_map, const CUtensorMap& w_map, const DownArgs& a,
                                  cudaStream_t stream) {
    return launch_items<kPairRows>(down_fp8_kernel, kThreads, kSmemBytes, &down_fit, a.pairs, a.experts,
                                   a.hidden / kBlockN, a.clusters, a.solo, a.ablate, stream, a_map, w_map,
                                   a.row_scale, a.w_scale, a.order, a.counts, a.y, a.hidden, a.inter, a.experts);
}

int clef::down_fp8_item_rows() { return kItemRows; }
