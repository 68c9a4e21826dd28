// Device helpers shared by the sm_90a expert kernels (moe_gate_up_fp8_sm90.cu, moe_down_fp8_sm90.cu): mbarriers,
// cp.async, TMA (multicast to a two-CTA cluster), wgmma on 128-byte-swizzled K-major tiles, and the pair-tile
// lookup over the per-expert row counts (a table in shared memory). PTX as the PTX ISA (8.x) documents it;
// nothing here allocates.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "moe_fp8_sm90.h"

namespace clef {


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

// Arrive on the barrier at the same shared-memory offset in CTA `cta` of this cluster. The default semantics
// (release at CTA scope): `.release.cluster` compiles to a GPU-scope MEMBAR before the arrive, which cost the
// multipliers about 2 us a k step (BENCHMARKS.md, "Engine, round thirteen"). Callers arrive only once their
// reads of the stage are complete (wgmma.wait_group), so nothing is left for a fence to order.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t cta) {
    asm volatile(
        "{\n\t.reg .b32 remote;\n\t"
        "mapa.shared::cluster.u32 remote, %0, %1;\n\t"
        "mbarrier.arrive.shared::cluster.b64 _, [remote];\n\t}" ::"r"(bar),
        "r"(cta)
        : "memory");
}

// a / b as Triton divides float32 (`div.full.f32`: about 2 ulp, no slow path), where C++'s `/` is the IEEE
// division (`div.rn.f32`), which ptxas expands to a reciprocal, its refinement and a call for the hard cases.
__device__ __forceinline__ float div_full(float a, float b) {
    float r;
    asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared memory at `src` to global `dst` by
// a bulk async copy (async proxy: the writer fences its generic stores first), committed as a group of its own.
__device__ __forceinline__ void bulk_copy_to_global(void* dst, const void* src, int bytes) {
    asm volatile(
        "cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n\t"
        "cp.async.bulk.commit_group;" ::"l"(dst),
        "r"(smem_addr(src)), "r"(bytes)
        : "memory");
}

// Waits until this thread's bulk copies have read their shared memory (it may be written again).
__device__ __forceinline__ void bulk_copies_read() {
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Waits until this thread's bulk copies are complete (their writes done).
__device__ __forceinline__ void bulk_copies_done() {
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
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

// A (1, 128, 128) box of a 3-D tensor map at (expert, row, k) into `dst` of this CTA, counted on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int k, int row, int expert) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(k), "r"(row), "r"(expert)
        : "memory");
}

// A (128, 128) box of a 2-D tensor map at (k, row) into `dst` of this CTA, counted on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int k, int row) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(k), "r"(row)
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

// This CTA's share of the work: with clusters, CTA `rank` of cluster `first` of `stride` takes the `rank` half of
// items first, first + stride, ...; alone (`solo`), CTA `first` of `stride` takes half items first, first +
// stride, ... of twice as many (item w: half w % 2 of item w / 2), loading the whole weight tile itself.
struct Share {
    int first, stride, items;
};

__device__ inline Share share(bool solo, int work) {
    if (solo) return Share{static_cast<int>(blockIdx.x), static_cast<int>(gridDim.x), 2 * work};
    return Share{static_cast<int>(blockIdx.x >> 1), static_cast<int>(gridDim.x >> 1), work};
}

struct Tile {
    int expert;   // >= experts: past the last pair tile
    int row0;     // first sorted row of the pair tile
    int row_end;  // end row of the expert
};

// Built with CLEF_SM90_PINGPONG=1 (`moe_fp8_sm90.build(..., variant="pingpong")`, benches), each kernel's two
// multiplier warpgroups take turns: each takes every other work item of its CTA, 64 rows (a pair tile of 128 rows,
// the two CTAs still sharing the weight tile), and its k loop starts only once the other's previous k loop has ended
// (`turn` barriers), so that one warpgroup's epilogue runs while the other's products keep the tensor cores busy.
// The turns also keep a warpgroup that skips the other's stages from reading a stage barrier's phase parity a
// round early. Each stage is read by one warpgroup a CTA.
#ifndef CLEF_SM90_PINGPONG
#define CLEF_SM90_PINGPONG 0
#endif
constexpr bool kPingPong = CLEF_SM90_PINGPONG != 0;
constexpr int kItemRows = kPingPong ? 64 : kBlockM;  // rows of a CTA's work item in both kernels
constexpr int kPairRows = 2 * kItemRows;             // rows of a pair tile (both CTAs)

// The pair tiles of every expert, built once per CTA into shared memory (`build_tile_table`) so that finding a
// work item's tile is a binary search there instead of a scan of `counts` in global memory per item.
struct TileTable {
    int tile_end[kMaxExperts];   // running count of pair tiles through expert e
    int row_begin[kMaxExperts];  // first sorted row of expert e
    int row_end[kMaxExperts];    // end sorted row of expert e
};

// Fills `tab` from the per-expert row counts (`experts` <= kMaxExperts, the binding checks) for pair tiles of
// `kTileRows` rows; warp-collective, one warp of the CTA. The readers wait for a CTA barrier after it
// (init_stage_barriers' cluster_sync).
template <int kTileRows = 2 * kBlockM>
__device__ inline void build_tile_table(const int* __restrict__ counts, int experts, TileTable& tab) {
    const int lane = threadIdx.x & 31;
    int carry_tiles = 0, carry_rows = 0;
    for (int base = 0; base < experts; base += 32) {
        const int e = base + lane;
        const int c = e < experts ? counts[e] : 0;
        int tiles = (c + kTileRows - 1) / kTileRows, rows = c;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int a = __shfl_up_sync(0xffffffffu, tiles, off);
            const int b = __shfl_up_sync(0xffffffffu, rows, off);
            if (lane >= off) {
                tiles += a;
                rows += b;
            }
        }
        if (e < experts) {
            tab.tile_end[e] = carry_tiles + tiles;
            tab.row_begin[e] = carry_rows + rows - c;
            tab.row_end[e] = carry_rows + rows;
        }
        carry_tiles += __shfl_sync(0xffffffffu, tiles, 31);
        carry_rows += __shfl_sync(0xffffffffu, rows, 31);
    }
}

// The pair tile `p` (`kTileRows` sorted rows of one expert, as `tab` was built): the first expert whose tiles
// end past `p`, by a binary search of `tab`; any thread alone (and the host: tests/gpu/test_moe_fp8_sm90_tiles.py).
template <int kTileRows = 2 * kBlockM>
__host__ __device__ __forceinline__ Tile find_tile(const TileTable& tab, int experts, int p) {
    int lo = 0, hi = experts;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (tab.tile_end[mid] > p) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    if (lo >= experts) return Tile{experts, 0, 0};
    const int first = lo > 0 ? tab.tile_end[lo - 1] : 0;
    return Tile{lo, tab.row_begin[lo] + (p - first) * kTileRows, tab.row_end[lo]};
}

// Thread 0 sets up the stage barriers: each full barrier expects `full_arrivals`, each empty one the
// `consumers_per_cta` multiplier warpgroups that read a stage, of both CTAs (alone: of this one). Every thread of
// the cluster then waits until both CTAs have theirs, before any peer may arrive on them or multicast into this
// CTA; the same barrier (release, then acquire) publishes what other threads wrote to shared memory before it (the
// tile table).
template <int kStages>
__device__ __forceinline__ void init_stage_barriers(uint64_t* full_bar, uint64_t* empty_bar, uint32_t full_arrivals,
                                                    bool solo, uint32_t consumers_per_cta = 2) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(smem_addr(&full_bar[s]), full_arrivals);
            mbar_init(smem_addr(&empty_bar[s]), solo ? consumers_per_cta : 2 * consumers_per_cta);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    cluster_sync();
}

// One work item of this CTA (pair tiles of `kTileRows` rows, half each CTA), from its index `v` in `share`'s
// sequence: the column block, the pair tile
// (tile.expert >= experts: past the last one, where the loop ends), this CTA's first row, and whether the item
// is an empty half (solo only: nobody waits on it, skip it).
struct Item {
    int nblk;
    Tile tile;
    int row0;
    bool empty;
};

template <int kTileRows = 2 * kBlockM>
__device__ inline Item item_at(int v, bool solo, uint32_t rank, int nblocks, const TileTable& tab, int experts) {
    const int w = solo ? v >> 1 : v;
    const int half = solo ? (v & 1) : static_cast<int>(rank);
    Item item{w % nblocks, find_tile<kTileRows>(tab, experts, w / nblocks), 0, false};
    item.row0 = item.tile.row0 + half * (kTileRows / 2);
    item.empty = solo && item.row0 >= item.tile.row_end;
    return item;
}

// The (kBlockN, kBlockK) weight tile of column block `nblk`, k step `ks` of `expert` into `b_dst`, counted on
// `full`: alone, both halves; in a cluster, this CTA's half (`rank`) multicast to both CTAs.
__device__ __forceinline__ void load_weight_tile(uint32_t b_dst, const CUtensorMap* map, uint32_t full, int ks, int nblk,
                                                 int expert, bool solo, uint32_t rank) {
    constexpr int kHalfRows = kBlockN / 2, kHalfBytes = kHalfRows * kBlockK;
    if (solo) {
        for (int half = 0; half < 2; ++half) {
            tma_load_3d(b_dst + half * kHalfBytes, map, full, ks * kBlockK, nblk * kBlockN + half * kHalfRows, expert);
        }
    } else {
        tma_load_multicast(b_dst + rank * kHalfBytes, map, full, ks * kBlockK,
                           nblk * kBlockN + static_cast<int>(rank) * kHalfRows, expert);
    }
}

// Built with CLEF_SM90_EARLY_RELEASE=1 (`moe_fp8_sm90.build(..., variant="early_release")`, benches), a
// multiplier warpgroup waits for each k step's products before the next step and frees that step's stage at once,
// so three of the four stages load ahead instead of two; the other multiplier warpgroup keeps the tensor cores
// busy meanwhile. The default keeps one step's products in flight and frees the stage a step later.
#ifndef CLEF_SM90_EARLY_RELEASE
#define CLEF_SM90_EARLY_RELEASE 0
#endif
constexpr bool kEarlyRelease = CLEF_SM90_EARLY_RELEASE != 0;

// Arrive on stage barrier `bar` of both CTAs of the cluster (alone: of this one).
__device__ __forceinline__ void release_stage(uint32_t bar, bool solo) {
    mbar_arrive_cluster(bar, 0);
    if (!solo) mbar_arrive_cluster(bar, 1);
}

// A multiplier warpgroup's k loop over one work item: `ksteps` stages from pipeline step `it` on (advanced),
// each waited for on its full barrier, multiplied into d (the 64 rows at byte `a_offset` of the stage's A tile
// by its whole B tile; the first step overwrites d) and released to both CTAs (alone: to this one) once its
// products are done (see kEarlyRelease). `proxy_fence`: the A tile was written by cp.async (generic proxy) and
// is read by wgmma (async proxy). `ablate` 1 skips the products (benches). `pre.midway()` runs once, after the
// first step's products are issued: the epilogue's loads that wait on earlier ones (their addresses) stall there,
// under the tensor cores' work, not before it.
template <int kStages, int kStageBytes, int kABytes, typename Pre>
__device__ __forceinline__ void multiply_item(float (&d)[128], uint32_t stages, uint64_t* full_bar, uint64_t* empty_bar,
                                              int& it, int ksteps, int wg, int t, bool solo, int ablate,
                                              bool proxy_fence, Pre& pre, uint32_t a_offset) {
    for (int ks = 0; ks < ksteps; ++ks, ++it) {
        const int s = it % kStages;
        mbar_wait(smem_addr(&full_bar[s]), (it / kStages) & 1);
        if (proxy_fence) asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        const uint32_t a = stages + s * kStageBytes + a_offset;
        const uint32_t b = stages + s * kStageBytes + kABytes;
        if (ablate != 1) {  // the whole group or none: a group of a run-time count of products made ptxas
                            // commit a dummy product, and "wait_group 1" then waited for this step's own
            asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
            for (int kk = 0; kk < kBlockK / 32; ++kk) {
                wgmma_64x256x32(d, smem_desc(a + kk * 32), smem_desc(b + kk * 32), (ks > 0 || kk > 0) ? 1u : 0u);
            }
            asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
            if constexpr (kEarlyRelease) {
                asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
            } else {
                asm volatile("wgmma.wait_group.sync.aligned 1;" ::: "memory");
            }
        }
        if constexpr (kEarlyRelease) {
            if (t == 0) release_stage(smem_addr(&empty_bar[s]), solo);  // this step's products are done
        } else {
            // the previous step's products are done: its stage is free
            if (ks > 0 && t == 0) release_stage(smem_addr(&empty_bar[(it - 1) % kStages]), solo);
        }
        if (ks == 0) pre.midway();
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    fence_operands(d);
    if (!kEarlyRelease && t == 0) release_stage(smem_addr(&empty_bar[(it - 1) % kStages]), solo);  // the last stage
}

// Thread t < 64 of a multiplier warpgroup copies 16 bytes of the item's 256 float32 column scales `src` into
// `dst` (1 KB, 16-byte aligned) without waiting; `scales_ready` before the warpgroup's barrier makes them
// readable. The copy is the thread's only cp.async, so waiting for all of them waits for it.
__device__ __forceinline__ void prefetch_scales(float* dst, const float* src, int t) {
    if (t < 64) cp_async_16(smem_addr(dst + 4 * t), src + 4 * t);
}

__device__ __forceinline__ void scales_ready() {
    asm volatile("cp.async.wait_all;" ::: "memory");
}

// The multiplier warpgroups' part of a kernel (threads 128 and up): take the registers the loader gave up,
// then for each of this CTA's work items (`mine`, as the loader walks them) start the epilogue's own reads
// (`pre = prefetch(item, wg, t)`: loads whose values are first used after the k loop, so that their latency
// passes under it; `pre.midway()` as multiply_item says), run the k loop into d (`multiply_item`, `proxy_fence`
// as there) and hand the products to `epilogue(item, d, wg, t, pre)`, where wg is the warpgroup and t the
// thread within it. Each item is 64 rows of the tile for each warpgroup (rows 64 wg ..); with kPingPong,
// warpgroup wg takes the whole of the items j with j % 2 == wg instead, skipping the other's k steps in the stage
// sequence, and starts each k loop only after the other warpgroup's previous one has ended (it waits on
// `turn_bar[wg]` and arrives on `turn_bar[1 - wg]`; unused otherwise). `ablate` 3 skips the epilogue (benches:
// nothing is written).
template <int kStages, int kStageBytes, int kABytes, typename Prefetch, typename Epilogue>
__device__ __forceinline__ void multiply_items(const Share& mine, bool solo, uint32_t rank, int nblocks,
                                               const TileTable& tab, int experts, uint32_t stages,
                                               uint64_t* full_bar, uint64_t* empty_bar, uint64_t* turn_bar,
                                               int ksteps, int ablate, bool proxy_fence, Prefetch&& prefetch,
                                               Epilogue&& epilogue) {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int wg = (static_cast<int>(threadIdx.x) - 128) >> 7;
    const int t = threadIdx.x & 127;
    float d[128];
#pragma unroll
    for (int i = 0; i < 128; ++i) d[i] = 0.0f;
    fence_operands(d);
    int it = 0;    // pipeline step
    int j = 0;     // this CTA's items so far, both warpgroups'
    int done = 0;  // this warpgroup's items so far
    for (int v = mine.first; v < mine.items; v += mine.stride, ++j) {
        const Item item = item_at<kPairRows>(v, solo, rank, nblocks, tab, experts);
        if (item.tile.expert >= experts) break;
        if (item.empty) {
            --j;  // skipped by both warpgroups and the loader alike: no stage steps
            continue;
        }
        if (kPingPong && (j & 1) != wg) continue;
        auto pre = prefetch(item, wg, t);
        if constexpr (kPingPong) {
            // the other warpgroup's k loop of item j - 1 has ended: its (done - 1 + wg)-th, a phase of turn_bar[wg]
            if (j > 0) mbar_wait(smem_addr(&turn_bar[wg]), (done - 1 + wg) & 1);
            it = j * ksteps;
        }
        multiply_item<kStages, kStageBytes, kABytes>(d, stages, full_bar, empty_bar, it, ksteps, wg, t, solo, ablate,
                                                     proxy_fence, pre, kPingPong ? 0u : wg * 64 * kBlockK);
        if (kPingPong && t == 0) mbar_arrive_cluster(smem_addr(&turn_bar[1 - wg]), rank);  // this CTA's own
        ++done;
        if (ablate != 3) {
            epilogue(item, d, wg, t, pre);
        } else {
            scales_ready();  // 3: without the epilogue (benches); its prefetched scales land before the next
        }
    }
}

// The launch configuration of a kernel of `threads` threads and `smem` bytes of dynamic shared memory in
// two-CTA clusters (the attribute lives in `attr`); the grid is left to the caller.
inline cudaLaunchConfig_t cluster_config(cudaLaunchAttribute* attr, int threads, int smem, cudaStream_t stream) {
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = 2;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.blockDim = dim3(threads, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

// How many two-CTA clusters of `kernel` fit on the current GPU at once, into `cached` (queried once).
template <typename... Params>
cudaError_t clusters_fit_of(void (*kernel)(Params...), int threads, int smem, int* cached) {
    if (*cached == 0) {
        cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        cudaLaunchAttribute attr[1];
        cudaLaunchConfig_t cfg = cluster_config(attr, threads, smem, nullptr);
        cfg.gridDim = dim3(2, 1, 1);
        int fit = 0;
        if (err == cudaSuccess) err = cudaOccupancyMaxActiveClusters(&fit, kernel, &cfg);
        if (err != cudaSuccess) return err;
        if (fit < 1) return cudaErrorInvalidConfiguration;
        *cached = fit;
    }
    return cudaSuccess;
}

// Launches `kernel` over the work items of `pairs` sorted pairs: an upper bound of the `kTileRows`-row pair tiles
// times `nblocks` column blocks, in as many two-CTA clusters as fit (`clusters` 0; the count is queried once into
// `fit`) or at most `clusters`, never more than there are items; `solo` drops the cluster attribute and runs
// as many lone CTAs. The kernel takes `args`, then the work items, `solo` and `ablate`.
template <int kTileRows = 2 * kBlockM, typename... Params, typename... Args>
cudaError_t launch_items(void (*kernel)(Params...), int threads, int smem, int* fit, int64_t pairs, int experts,
                         int nblocks, int clusters, bool solo, int ablate, cudaStream_t stream, Args... args) {
    const cudaError_t err = clusters_fit_of(kernel, threads, smem, fit);
    if (err != cudaSuccess) return err;
    const int64_t pair_tiles = (pairs + int64_t{experts} * (kTileRows - 1)) / kTileRows;  // upper bound
    const int64_t work = pair_tiles * nblocks;
    const int64_t ask = clusters > 0 ? clusters : *fit;
    cudaLaunchAttribute attr[1];
    cudaLaunchConfig_t cfg = cluster_config(attr, threads, smem, stream);
    cfg.gridDim = dim3(static_cast<unsigned>(2 * (work < ask ? work : ask)), 1, 1);
    if (solo) cfg.numAttrs = 0;
    return cudaLaunchKernelEx(&cfg, kernel, args..., static_cast<int>(work), solo, ablate);
}
}  // namespace clef
