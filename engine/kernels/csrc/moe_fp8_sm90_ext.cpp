// Torch binding of the CUDA expert kernels (moe_gate_up_fp8_sm90.cu, moe_down_fp8_sm90.cu): checks the tensors,
// encodes the TMA descriptors and launches on the current stream. Built by engine/kernels/moe_fp8_sm90.py.
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <utility>

#include "moe_fp8_sm90.h"

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn == nullptr) {
        void* p = nullptr;
        cudaDriverEntryPointQueryResult status;
        C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &status));
        TORCH_CHECK(status == cudaDriverEntryPointSuccess && p != nullptr, "cuTensorMapEncodeTiled not found");
        fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
    }
    return fn;
}

// A 128-byte-swizzled uint8 tensor map over `t`'s bytes: `rank` dims (innermost first) in boxes of `box`.
CUtensorMap tensor_map(const torch::Tensor& t, int rank, const cuuint64_t* dims, const cuuint32_t* box) {
    CUtensorMap map;
    cuuint64_t strides[2];
    for (int i = 0; i + 1 < rank; ++i) strides[i] = (i == 0 ? dims[0] : strides[i - 1] * dims[i]);
    const cuuint32_t elem[3] = {1, 1, 1};
    const CUresult res = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, t.data_ptr(), dims, strides, box,
                                        elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    TORCH_CHECK(res == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed: ", static_cast<int>(res));
    return map;
}

// The kernels' `clusters` argument: 0 as many as fit at once (persistent), else at most that many.
int clamp_clusters(int64_t clusters) {
    TORCH_CHECK(clusters >= 0, "clusters must be >= 0");
    return static_cast<int>(std::min<int64_t>(clusters, int64_t{1} << 30));
}

void check(const torch::Tensor& t, c10::ScalarType dtype, int64_t dims, const char* name) {
    TORCH_CHECK(t.is_cuda() && t.is_contiguous(), name, " must be a contiguous CUDA tensor");
    TORCH_CHECK(t.scalar_type() == dtype, name, " has dtype ", t.scalar_type(), ", expected ", dtype);
    TORCH_CHECK(t.dim() == dims, name, " must have ", dims, " dimensions");
}

// q (S, I) e4m3 and q_scale (S, I / 128) float32 from x (T, H) e4m3, x_scale (T,), w (E, 2I, H) e4m3 with
// w_scale (E, 2I), order (S,) and counts (E,) int32, top_w (T, k) float32; `clusters` as clamp_clusters,
// `solo` and `ablate` as clef::GateUpArgs' (ablate: benches only).
void gate_up_fp8(torch::Tensor x, torch::Tensor x_scale, torch::Tensor w, torch::Tensor w_scale,
                 torch::Tensor order, torch::Tensor counts, torch::Tensor top_w, torch::Tensor q,
                 torch::Tensor q_scale, int64_t clusters, bool solo, int64_t ablate) {
    check(x, at::kFloat8_e4m3fn, 2, "x");
    check(x_scale, at::kFloat, 1, "x_scale");
    check(w, at::kFloat8_e4m3fn, 3, "w");
    check(w_scale, at::kFloat, 2, "w_scale");
    check(order, at::kInt, 1, "order");
    check(counts, at::kInt, 1, "counts");
    check(top_w, at::kFloat, 2, "top_w");
    check(q, at::kFloat8_e4m3fn, 2, "q");
    check(q_scale, at::kFloat, 2, "q_scale");
    const int64_t tokens = x.size(0), hidden = x.size(1), experts = w.size(0), inter = w.size(1) / 2;
    const int64_t pairs = order.size(0), top_k = top_w.size(1);
    TORCH_CHECK(hidden % clef::kBlockK == 0 && inter % clef::kGroup == 0, "H and I must be multiples of 128");
    TORCH_CHECK(experts <= clef::kMaxExperts, "at most ", clef::kMaxExperts, " experts");
    TORCH_CHECK(w.size(2) == hidden && counts.size(0) == experts && top_w.size(0) == tokens && pairs == tokens * top_k,
                "inconsistent shapes");
    TORCH_CHECK(x_scale.size(0) == tokens && w_scale.size(0) == experts && w_scale.size(1) == 2 * inter,
                "inconsistent scale shapes");
    TORCH_CHECK(q.size(0) == pairs && q.size(1) == inter && q_scale.size(0) == pairs &&
                q_scale.size(1) == inter / clef::kGroup, "inconsistent output shapes");
    TORCH_CHECK(tokens * hidden < (int64_t{1} << 32) - 1, "x too large for 32-bit offsets");
    if (pairs == 0) return;

    const cuuint64_t dims[3] = {static_cast<cuuint64_t>(hidden), static_cast<cuuint64_t>(2 * inter),
                                static_cast<cuuint64_t>(experts)};
    const cuuint32_t box[3] = {clef::kBlockK, clef::kBlockN / 2, 1};
    const CUtensorMap map = tensor_map(w, 3, dims, box);
    const clef::GateUpArgs args{
        static_cast<const uint8_t*>(x.data_ptr()), x_scale.data_ptr<float>(), w_scale.data_ptr<float>(),
        order.data_ptr<int>(), counts.data_ptr<int>(), top_w.data_ptr<float>(),
        static_cast<uint8_t*>(q.data_ptr()), q_scale.data_ptr<float>(), pairs,
        static_cast<int>(hidden), static_cast<int>(inter), static_cast<int>(experts), static_cast<int>(top_k),
        clamp_clusters(clusters), solo, static_cast<int>(ablate)};
    C10_CUDA_CHECK(clef::launch_gate_up_fp8(map, args, at::cuda::getCurrentCUDAStream()));
}

// y (S, H) bf16 in pair order from q (S, I) e4m3 in expert order with row_scale (S,), w (E, H, I) e4m3 with
// w_scale (E, H), order (S,) and counts (E,) int32; `clusters`, `solo` and `ablate` as gate_up_fp8's.
void down_fp8(torch::Tensor q, torch::Tensor row_scale, torch::Tensor w, torch::Tensor w_scale, torch::Tensor order,
              torch::Tensor counts, torch::Tensor y, int64_t clusters, bool solo, int64_t ablate) {
    check(q, at::kFloat8_e4m3fn, 2, "q");
    check(row_scale, at::kFloat, 1, "row_scale");
    check(w, at::kFloat8_e4m3fn, 3, "w");
    check(w_scale, at::kFloat, 2, "w_scale");
    check(order, at::kInt, 1, "order");
    check(counts, at::kInt, 1, "counts");
    check(y, at::kBFloat16, 2, "y");
    const int64_t pairs = q.size(0), inter = q.size(1), experts = w.size(0), hidden = w.size(1);
    TORCH_CHECK(hidden % clef::kBlockN == 0 && inter % clef::kBlockK == 0, "H must be a multiple of 256, I of 128");
    TORCH_CHECK(w.size(2) == inter && w_scale.size(0) == experts && w_scale.size(1) == hidden &&
                counts.size(0) == experts && order.size(0) == pairs && row_scale.size(0) == pairs,
                "inconsistent shapes");
    TORCH_CHECK(y.size(0) == pairs && y.size(1) == hidden, "y must be (S, H)");
    TORCH_CHECK(experts <= clef::kMaxExperts, "at most ", clef::kMaxExperts, " experts");
    if (pairs == 0) return;
    const cuuint64_t a_dims[2] = {static_cast<cuuint64_t>(inter), static_cast<cuuint64_t>(pairs)};
    const cuuint32_t a_box[2] = {clef::kBlockK, static_cast<cuuint32_t>(clef::down_fp8_item_rows())};
    const cuuint64_t w_dims[3] = {static_cast<cuuint64_t>(inter), static_cast<cuuint64_t>(hidden),
                                  static_cast<cuuint64_t>(experts)};
    const cuuint32_t w_box[3] = {clef::kBlockK, clef::kBlockN / 2, 1};
    const CUtensorMap a_map = tensor_map(q, 2, a_dims, a_box);
    const CUtensorMap w_map = tensor_map(w, 3, w_dims, w_box);
    const clef::DownArgs args{row_scale.data_ptr<float>(), w_scale.data_ptr<float>(), order.data_ptr<int>(),
                              counts.data_ptr<int>(), reinterpret_cast<__nv_bfloat16*>(y.data_ptr()), pairs,
                              static_cast<int>(hidden), static_cast<int>(inter), static_cast<int>(experts),
                              clamp_clusters(clusters), solo, static_cast<int>(ablate)};
    C10_CUDA_CHECK(clef::launch_down_fp8(a_map, w_map, args, at::cuda::getCurrentCUDAStream()));
}

// The two-CTA clusters each kernel keeps resident at once on the current GPU: (gate/up, down).
std::pair<int64_t, int64_t> clusters_fit() {
    int gate_up = 0, down = 0;
    C10_CUDA_CHECK(clef::gate_up_fp8_clusters(&gate_up));
    C10_CUDA_CHECK(clef::down_fp8_clusters(&down));
    return {gate_up, down};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("gate_up_fp8", &gate_up_fp8,
          "FP8 expert gate/up GEMM, SwiGLU and per-128-channel quantisation, two-CTA clusters (sm_90a)");
    m.def("clusters_fit", &clusters_fit, "two-CTA clusters resident at once: (gate/up, down)");
    m.def("down_fp8", &down_fp8, "FP8 expert down GEMM on row-scaled activations, two-CTA clusters (sm_90a)");
}
