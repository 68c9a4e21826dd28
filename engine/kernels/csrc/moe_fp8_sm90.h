// The seam between the CUDA expert kernels (moe_gate_up_fp8_sm90.cu, moe_down_fp8_sm90.cu, compiled by nvcc) and
// their torch binding (moe_fp8_sm90_ext.cpp): raw pointers and sizes, checked by the binding.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace clef {

constexpr int kBlockM = 128;         // sorted rows per CTA (two of them share a weight tile)
constexpr int kBlockN = 256;         // weight rows per tile (gate/up: interleaved, 128 channels)
constexpr int kBlockK = 128;         // e4m3 bytes of k per pipeline stage
constexpr int kGroup = kBlockN / 2;  // channels per activation scale of the gate/up output
constexpr int kMaxExperts = 256;     // experts the kernels' shared-memory tile table holds

// Both kernels run (pair tile, column block) work items, a pair tile being 256 sorted rows of one expert (two
// CTAs of 128), over a static upper bound of the pair tiles; each cluster takes items cluster, cluster +
// clusters, ... so that, with fewer clusters than items, a CTA's loader runs ahead into its next item while its
// multipliers finish the last one.
struct GateUpArgs {
    const uint8_t* x;       // (T, H) e4m3 rows
    const float* x_scale;   // (T,)
    const float* w_scale;   // (E, 2I), interleaved as the weight rows
    const int* order;       // (S,) pair ids sorted by expert
    const int* counts;      // (E,)
    const float* top_w;     // (S,) routing weight per pair id
    uint8_t* q;             // (S, I) e4m3, expert order
    float* q_scale;         // (S, I / kGroup)
    int64_t pairs;          // S = T k
    int hidden, inter, experts, top_k;
    int clusters;           // at most this many two-CTA clusters, each looping over work items; 0: as many as fit
    bool solo;              // no clusters: each CTA loads its whole weight tile (twice the CTAs, no multicast)
    int ablate;             // benches: 0 the kernel; 1 without the products, 2 without the loads, 3 without
                            // the epilogue (wrong results)
};

// `w_map`: the (E, 2I, H) e4m3 weights as a 3-D uint8 tensor map in (1, kBlockN / 2, kBlockK) boxes with the
// 128-byte swizzle. Launches on `stream`; returns the launch's error.
cudaError_t launch_gate_up_fp8(const CUtensorMap& w_map, const GateUpArgs& args, cudaStream_t stream);

// How many two-CTA clusters of each kernel the current GPU holds at once (cudaOccupancyMaxActiveClusters).
cudaError_t gate_up_fp8_clusters(int* fit);
cudaError_t down_fp8_clusters(int* fit);

struct DownArgs {
    const float* row_scale;  // (S,) one scale per activation row (the requantising pass)
    const float* w_scale;    // (E, H)
    const int* order;        // (S,)
    const int* counts;       // (E,)
    __nv_bfloat16* y;        // (S, H) bf16, pair order
    int64_t pairs;
    int hidden, inter, experts;
    int clusters;            // as GateUpArgs::clusters
    bool solo;               // as GateUpArgs::solo
    int ablate;              // as GateUpArgs::ablate
};

// `a_map`: the (S, I) e4m3 activations as a 2-D uint8 tensor map in (down_fp8_item_rows(), kBlockK) boxes; `w_map`: the
// (E, H, I) e4m3 down weights as a 3-D one in (1, kBlockN / 2, kBlockK) boxes; both with the 128-byte swizzle.
cudaError_t launch_down_fp8(const CUtensorMap& a_map, const CUtensorMap& w_map, const DownArgs& args,
                            cudaStream_t stream);

// Rows of the down kernel's activation box (`a_map`'s box height): kBlockM, or 64 in the ping-pong variant.
int down_fp8_item_rows();

}  // namespace clef
