#version 450
// Winograd F(4x4, 3x3) for 3x3 stride-1 convolutions (Lavin & Gray 2015): each 4x4
// output tile is A^T [ (G g G^T) . (B^T d B) ] A over a 6x6 input tile, so the channel
// sums become 36 independent GEMMs (run by convolution_gemm.comp) with a quarter of the
// direct convolution's products.  Three passes live here, one per variant family:
//
//   WEIGHTS  U[p][ci][co] = (G g[co][ci] G^T)[p]    (kernel flipped in CONVOLUTION mode;
//                                                   output channels padded to the block)
//   INPUT    V[p][ci][t]  = (B^T d[t][ci] B)[p]     (t: tile over batch and space; zero
//                                                   outside the input: padding; tiles
//                                                   padded to a multiple of 4)
//   OUTPUT   y[n][co][tile] = act(A^T M[.][co][t] A + bias), stored through the output's
//            DML strides (partial tiles at the border are cut).
//   OUTPUT POOL=1: the same values pooled before they are stored (a graph's fusion of
//            the convolution with the LP pooling that alone reads its output, 2x2 windows,
//            stride 2, no padding, dilation 1): a 4x4 tile starts at multiples of 4, so it
//            holds whole windows, 2x2 of them; each window's four values (rounded to the
//            tensor's type first, as the unfused convolution stores them) are pooled with
//            glsl/lp_pooling.comp's formula (P, SCALE; same order of the sums) and only
//            the pooled outputs are stored (out_size.xy and ys: the pooled tensor's).
//   OUTPUT (not POOL) with bias_step.y != 0: a graph's residual R added after the bias
//            (a run-time switch, not a variant: one pipeline serves the convolutions
//            with and without a residual, which on a CPU driver each cost a compile).
//
// The passes read their source through uniform texel buffers (R32F/R16F views: any
// float storage reads as float) where the device can bind it, else storage buffers.
//
// vkml:variant convolution_winograd_weights_texel WEIGHTS=1 TEXEL=1 F32=1
// vkml:variant convolution_winograd_weights_f32 WEIGHTS=1 F32=1
// vkml:variant convolution_winograd_weights_f16 WEIGHTS=1 F16=1
// vkml:variant convolution_winograd_weights_f16_packed WEIGHTS=1 F16_PACKED=1
// vkml:variant convolution_winograd_input_texel INPUT=1 TEXEL=1 F32=1
// vkml:variant convolution_winograd_input_texel4 INPUT=1 TEXEL=1 F32=1 X4=1
// vkml:variant convolution_winograd_input_texel4_v8 INPUT=1 TEXEL=1 F32=1 X4=1 V8=1
// vkml:variant convolution_winograd_gemm_cl GEMM=1 F32=1
// vkml:variant convolution_winograd_gemm_cl_v8 GEMM=1 F32=1 V8=1
// vkml:variant convolution_winograd_input_f32 INPUT=1 F32=1
// vkml:variant convolution_winograd_input_f16 INPUT=1 F16=1
// vkml:variant convolution_winograd_input_f16_packed INPUT=1 F16_PACKED=1
// vkml:variant convolution_winograd_output_f32 OUTPUT=1 TEXEL=1 F32=1
// vkml:variant convolution_winograd_output_f32_v4 OUTPUT=1 TEXEL=1 F32=1 V4=1
// vkml:variant convolution_winograd_output_f32_v8 OUTPUT=1 TEXEL=1 F32=1 V4=1 V8=1
// vkml:variant convolution_winograd_output_f16_v8 OUTPUT=1 TEXEL=1 F16=1 V4=1 V8=1
// vkml:variant convolution_winograd_output_f16_packed_v8 OUTPUT=1 TEXEL=1 F16_PACKED=1 V4=1 V8=1
// vkml:variant convolution_winograd_output_f16 OUTPUT=1 TEXEL=1 F16=1
// vkml:variant convolution_winograd_output_f16_v4 OUTPUT=1 TEXEL=1 F16=1 V4=1
// vkml:variant convolution_winograd_output_f16_packed OUTPUT=1 TEXEL=1 F16_PACKED=1
// vkml:variant convolution_winograd_output_f16_packed_v4 OUTPUT=1 TEXEL=1 F16_PACKED=1 V4=1
// vkml:variant convolution_winograd_output_f32_ssbo OUTPUT=1 F32=1
// vkml:variant convolution_winograd_output_f16_ssbo OUTPUT=1 F16=1
// vkml:variant convolution_winograd_output_f16_packed_ssbo OUTPUT=1 F16_PACKED=1
// vkml:variant convolution_winograd_output_f32_pool OUTPUT=1 TEXEL=1 F32=1 POOL=1
// vkml:variant convolution_winograd_output_f16_pool OUTPUT=1 TEXEL=1 F16=1 POOL=1
// vkml:variant convolution_winograd_output_f16_packed_pool OUTPUT=1 TEXEL=1 F16_PACKED=1 POOL=1
// vkml:variant convolution_winograd_output_f32_ssbo_pool OUTPUT=1 F32=1 POOL=1
// vkml:variant convolution_winograd_output_f16_ssbo_pool OUTPUT=1 F16=1 POOL=1
// vkml:variant convolution_winograd_output_f16_packed_ssbo_pool OUTPUT=1 F16_PACKED=1 POOL=1
#extension GL_EXT_control_flow_attributes : require
#ifdef V8
#extension GL_ARB_gpu_shader_int64 : require
#include "vkml_u64.glsl"
#endif
#ifdef GEMM
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case; WINO_XO bounds the aligned float4
// reads of an input row (constant indices once frozen).
// vkml:frozen ACT WINO_XO
layout(constant_id = 1) const int ACT = 0;
#ifdef X4
layout(constant_id = 2) const int WINO_XO = 0;      // (-start padding w) mod 4 (frozen)
#endif
#ifdef POOL
layout(constant_id = 2) const uint P = 2u;          // LP pooling's P (glsl/lp_pooling.comp)
layout(constant_id = 3) const bool SCALE = false;   // its scaled sums
#endif

layout(std140, set = 0, binding = 3) uniform Params {
    ivec4 dims;      // C_in, padded C_out (co_pad), C_out, tiles T
    ivec4 tiles;     // tiles per row TW, tiles per image TH*TW, T rounded up to 4 (T4),
                     // V's row: T4, or T rounded up to 8 (T8) with V8
    ivec4 in_size;   // H, W, start padding h, w
    ivec4 xs;        // input strides n, c, h, w
    ivec4 fs;        // filter strides co, ci, kh, kw
    ivec4 out_size;  // OH, OW, flip, has bias (POOL: the pooled OH/2, OW/2)
    uvec4 ys;        // output strides n, c, h, w (POOL: the pooled tensor's)
    ivec4 bias_step; // bias stride, residual (OUTPUT: added where != 0), -, -
    vec4 act;
};

#ifndef GEMM
// source reads: float from any storage
#if defined(OUTPUT)
#ifdef TEXEL
layout(set = 0, binding = 0) uniform samplerBuffer src;      // RGBA32F view of M
#define LOAD4(i) texelFetch(src, int(i))
#else
layout(std430, set = 0, binding = 0) readonly buffer Src { vec4 src[]; };
#define LOAD4(i) src[i]
#endif
#elif defined(TEXEL)
layout(set = 0, binding = 0) uniform samplerBuffer src;     // R32F (X4: RGBA32F)
#define LOAD(i) texelFetch(src, int(i)).x
#else
layout(std430, set = 0, binding = 0) readonly buffer Src { FSTORE_T src[]; };
#define LOAD(i) FLOAD(src, uint(i))
#endif

#ifdef OUTPUT
// The residual (a graph's residual fusion, vkml/ops/graph.py; bias_step.y != 0): R laid
// out as the output (same type and element strides) added after the bias, before the
// activation.  Without one, binding 4 holds any buffer and is never read.
#ifndef POOL
layout(std430, set = 0, binding = 4) readonly buffer Res { FSTORE_T res[]; };
// V4 float32: a tile row of R as one load (lavapipe loads a vector in one lane turn)
layout(std430, set = 0, binding = 4) readonly buffer Res4 { vec4 res4[]; };
#endif
layout(std430, set = 0, binding = 1) readonly buffer Bias { FSTORE_T bias[]; };
layout(std430, set = 0, binding = 2) buffer Y { FSTORE_T y[]; };
// V4: a tile row is one store (packed rows of a multiple of 4: a float4, or float16's
// four halves as a uvec2; lavapipe stores a vector in one lane turn, a scalar in one
// turn each)
layout(std430, set = 0, binding = 2) buffer Y4 { vec4 y4[]; };
layout(std430, set = 0, binding = 2) buffer Y2 { uvec2 y2[]; };
#ifdef V8
// V8 (int64 shaders): two horizontally adjacent tiles' rows as one u64vec4 (float16: one
// u64vec2) (an even number of tiles per row: a lane's tile pairs share a row, 8-aligned)
layout(std430, set = 0, binding = 2) buffer Y8 { u64vec4 y8[]; };
layout(std430, set = 0, binding = 2) buffer Y8h { u64vec2 y8h[]; };  // float16: 8 halves
#endif
#else
layout(std430, set = 0, binding = 1) readonly buffer Unused { float unused_[]; };
#endif
#endif
#ifdef WEIGHTS
layout(std430, set = 0, binding = 2) writeonly buffer Dst4 { vec4 dst4[]; };
#endif

#ifdef WEIGHTS
// U[p][ci][co]: one invocation per four output channels of one input channel (co_pad is
// a multiple of 4), a float4 store per transform point: a quarter of the store turns
// (lavapipe stores one lane at a time).  Lanes run along (ci, co / 4) without a
// workgroup per channel, so few output channels leave no lanes idle.
void main() {
    int cin = dims.x, co_pad = dims.y;
    int lane = int(gl_GlobalInvocationID.x);       // lanes run along (ci, co / 4)
    int ci = lane / (co_pad >> 2);
    int co0 = (lane - ci * (co_pad >> 2)) * 4;
    if (ci >= cin) return;
    bool flip = out_size.z != 0;
    int cout = dims.z;
    vec4 u[6][6];
    [[unroll]] for (int q = 0; q < 4; q++) {
        int co = co0 + q;
        // (the padded channels' reads made at index 0 and selected away: a conditional
        // read is a branch of its own, see the input pass)
        bool cok = co < cout;
        float g[3][3];
        [[unroll]] for (int r = 0; r < 3; r++)
            [[unroll]] for (int c = 0; c < 3; c++) {
                int fr = flip ? 2 - r : r, fc = flip ? 2 - c : c;
                int i = co * fs.x + ci * fs.y + fr * fs.z + fc * fs.w;
                float x = LOAD(cok ? i : 0);
                g[r][c] = cok ? x : 0.0;
            }
        // G g: 6x3
        float t[6][3];
        [[unroll]] for (int c = 0; c < 3; c++) {
            float a = g[0][c], b = g[1][c], d = g[2][c];
            t[0][c] = a * 0.25;
            t[1][c] = -(a + b + d) * (1.0 / 6.0);
            t[2][c] = -(a - b + d) * (1.0 / 6.0);
            t[3][c] = a * (1.0 / 24.0) + b * (1.0 / 12.0) + d * (1.0 / 6.0);
            t[4][c] = a * (1.0 / 24.0) - b * (1.0 / 12.0) + d * (1.0 / 6.0);
            t[5][c] = d;
        }
        // (G g) G^T: 6x6
        [[unroll]] for (int r = 0; r < 6; r++) {
            float a = t[r][0], b = t[r][1], d = t[r][2];
            u[r][0][q] = a * 0.25;
            u[r][1][q] = -(a + b + d) * (1.0 / 6.0);
            u[r][2][q] = -(a - b + d) * (1.0 / 6.0);
            u[r][3][q] = a * (1.0 / 24.0) + b * (1.0 / 12.0) + d * (1.0 / 6.0);
            u[r][4][q] = a * (1.0 / 24.0) - b * (1.0 / 12.0) + d * (1.0 / 6.0);
            u[r][5][q] = d;
        }
    }
    int plane4 = cin * co_pad / 4;
    int o4 = (ci * co_pad + co0) / 4;
    [[unroll]] for (int r = 0; r < 6; r++)
        [[unroll]] for (int c = 0; c < 6; c++) dst4[(r * 6 + c) * plane4 + o4] = u[r][c];
}
#endif

#ifdef INPUT
#ifdef V8
layout(std430, set = 0, binding = 2) writeonly buffer Dst8 { u64vec4 dst8[]; };
const int QT = 8;
#else
layout(std430, set = 0, binding = 2) writeonly buffer Dst4 { vec4 dst4[]; };
const int QT = 4;
#endif

// One row (or column) of the input transform, B^T z: written once, used for the rows and
// the columns of every tile.
float[6] input_bt(float z[6]) {
    return float[6](4.0 * z[0] - 5.0 * z[2] + z[4],
                    -4.0 * (z[1] + z[2]) + z[3] + z[4],
                    4.0 * (z[1] - z[2]) - z[3] + z[4],
                    2.0 * (z[3] - z[1]) - z[2] + z[4],
                    2.0 * (z[1] - z[3]) - z[2] + z[4],
                    4.0 * z[1] - 5.0 * z[3] + z[5]);
}

// V[p][ci][t]: one invocation per QT consecutive tiles of one channel (lanes along
// (ci, t / QT), no workgroup per channel: no idle lanes at a channel's end), stored as one
// float4 per transform point (a quarter of the stores; storage-buffer stores go one
// lane at a time on lavapipe), or with V8 (int64 shaders) eight tiles as one u64vec4:
// lavapipe's store turn costs per component, and the 36 float4 stores would otherwise
// dominate this pass.
//
// The reads outside the input (padding, the tiles past T) are not branches: every read
// is made, at index 0 where the element is outside, and its value selected away.  A
// conditional read (`ok ? LOAD(i) : 0.0`, or a short-circuit `&&` on a uniform) is a
// branch of its own in SPIR-V, hundreds of blocks a module, which drivers that compile
// at pipeline creation (SwiftShader, lavapipe) pay for; hence the bounds as locals,
// combined without `&&` on anything but locals.
void main() {
    int lane = int(gl_GlobalInvocationID.x);       // lanes run along (ci, t / QT)
    int per_ci = tiles.w / QT;
    int ci = lane / per_ci;
    int t0 = (lane - ci * per_ci) * QT;
    if (ci >= dims.x) return;
    uint H = uint(in_size.x), W = uint(in_size.y);
    int xh = xs.z;
#ifndef X4
    int xw = xs.w;
#endif
    float v[6][6][QT];
    [[unroll]] for (int q = 0; q < QT; q++) {
        int t = t0 + q;
        int n = t / tiles.y;
        int rem = t - n * tiles.y;
        int th = rem / tiles.x;
        int tw = rem - th * tiles.x;
        int h0 = th * 4 - in_size.z, w0 = tw * 4 - in_size.w;
        int base = n * xs.x + ci * xs.y;
        bool tok = t < dims.w;
        float d[6][6];
#ifdef X4
        // (src viewed as RGBA32F, or RGBA16F for float16 tensors: four elements a texel)
        // rows packed (xs.w == 1), every row and W a multiple of 4: a tile row's 6 values
        // are elements WINO_XO.. of NV aligned float4s, each wholly inside the input or
        // wholly outside (zero): 18 fetches a tile instead of 36
        const int NV = (WINO_XO + 9) / 4;
        int a0 = w0 - WINO_XO;
        bool aok[NV];
        [[unroll]] for (int k = 0; k < NV; k++) aok[k] = uint(a0 + 4 * k) < W;
        [[unroll]] for (int r = 0; r < 6; r++) {
            int h = h0 + r;
            bool hin = uint(h) < H;
            bool hok = tok && hin;
            int rb = base + h * xh + a0;
            float row[NV * 4];
            [[unroll]] for (int k = 0; k < NV; k++) {
                bool ok = aok[k];
                ok = hok && ok;
                int i = rb + 4 * k;
                vec4 x = texelFetch(src, ok ? i >> 2 : 0);
                x = ok ? x : vec4(0.0);
                row[4 * k] = x.x; row[4 * k + 1] = x.y; row[4 * k + 2] = x.z; row[4 * k + 3] = x.w;
            }
            [[unroll]] for (int c = 0; c < 6; c++) d[r][c] = row[WINO_XO + c];
        }
#else
        bool wok[6];
        [[unroll]] for (int c = 0; c < 6; c++) wok[c] = uint(w0 + c) < W;
        [[unroll]] for (int r = 0; r < 6; r++) {
            int h = h0 + r;
            bool hin = uint(h) < H;
            bool hok = tok && hin;
            int rb = base + h * xh + w0 * xw;
            [[unroll]] for (int c = 0; c < 6; c++) {
                bool ok = wok[c];
                ok = hok && ok;
                int i = rb + c * xw;
                float x = LOAD(ok ? i : 0);
                d[r][c] = ok ? x : 0.0;
            }
        }
#endif
        // B^T d: the columns, then (B^T d) B: the rows
        float e[6][6];
        [[unroll]] for (int c = 0; c < 6; c++) {
            float z[6] = input_bt(float[6](d[0][c], d[1][c], d[2][c], d[3][c], d[4][c], d[5][c]));
            [[unroll]] for (int r = 0; r < 6; r++) e[r][c] = z[r];
        }
        [[unroll]] for (int r = 0; r < 6; r++) {
            float z[6] = input_bt(e[r]);
            [[unroll]] for (int c = 0; c < 6; c++) v[r][c][q] = z[c];
        }
    }
#ifdef V8
    int plane8 = dims.x * tiles.w / 8;
    int o8 = (ci * tiles.w + t0) / 8;
    [[unroll]] for (int r = 0; r < 6; r++)
        [[unroll]] for (int c = 0; c < 6; c++) {
            uvec4 b[2];
            [[unroll]] for (int q = 0; q < 8; q++) b[q >> 2][q & 3] = floatBitsToUint(v[r][c][q]);
            dst8[(r * 6 + c) * plane8 + o8] = vkml_u64x4(b[0], b[1]);
        }
#else
    int plane4 = dims.x * tiles.w / 4;
    int o4 = (ci * tiles.w + t0) / 4;
    [[unroll]] for (int r = 0; r < 6; r++)
        [[unroll]] for (int c = 0; c < 6; c++)
            dst4[(r * 6 + c) * plane4 + o4] = vec4(v[r][c][0], v[r][c][1], v[r][c][2], v[r][c][3]);
#endif
}
#endif

#ifdef OUTPUT
#ifdef POOL
#if defined(F16) || defined(F16_PACKED)
#define ROUND(v) vkml_half_float(vkml_half_bits(v))     // what the unfused output stores
#else
#define ROUND(v) (v)
#endif

// a^P for 0 <= a <= 1, by repeated squaring (glsl/lp_pooling.comp's pow_p).
float pow_p(float a) {
    float r = 1.0, b = a;
    [[unroll]] for (int bit = 0; bit < 32; bit++) {
        if ((P >> bit) == 0u) break;
        if (((P >> bit) & 1u) != 0u) r *= b;
        b *= b;
    }
    return r;
}

// One value's share of the scaled sum (glsl/lp_pooling.comp's share).
float share(float v, float m, float s1, float s2) {
    float a = abs(v);
    if (P == 2u) { float t = a * s1 * s2; return t * t; }
    return pow_p(a / m);
}

// The LP norm of one 2x2 window, its values in glsl/lp_pooling.comp's order (row by row):
// the same sums in the same order, so the same result as the LP pooling kernel.
float lp_window(float w[4]) {
    float acc = 0.0, mx = 0.0;
    [[unroll]] for (int k = 0; k < 4; k++) {
        float a = abs(w[k]);
        acc += (P == 2u && !SCALE) ? w[k] * w[k] : a;
        if (SCALE) mx = max(mx, a);
    }
    if (!SCALE) return P == 2u ? sqrt(acc) : acc;
    int e = clamp(int(floatBitsToUint(mx) >> 23), 1, 254);
    int h = (127 - e) / 2;
    float s1 = uintBitsToFloat(uint(127 + h) << 23);
    float s2 = uintBitsToFloat(uint(127 + (127 - e - h)) << 23);
    float sum = 0.0;
    [[unroll]] for (int k = 0; k < 4; k++) sum += share(w[k], mx, s1, s2);
    float y = P == 2u ? sqrt(sum) / s1 / s2 : mx * pow(sum, 1.0 / float(P));
    y = mx == 0.0 ? 0.0 : y;
    y = isinf(mx) ? mx : y;
    return isnan(acc) ? acc : y;
}
#endif

// One row (or column) of the output transform, A^T z: written once, used for the
// columns and the rows of every tile.
float[4] output_at(float z[6]) {
    return float[4](z[0] + z[1] + z[2] + z[3] + z[4],
                    z[1] - z[2] + 2.0 * (z[3] - z[4]),
                    z[1] + z[2] + 4.0 * (z[3] + z[4]),
                    z[1] - z[2] + 8.0 * (z[3] - z[4]) + z[5]);
}

// y = A^T M A + bias: one invocation per four consecutive tiles of one output channel,
// each transform point read as one float4 (four tiles).
//
// V4 (a tile row a store): no store is conditional.  A partial tile at the bottom border
// stores its rows past the output at the last row inside it, with that row's own values
// (selected), so every element is written by its own tile alone, the same bits each
// time.  A guarded store is a branch of its own in SPIR-V (with `&&` on uniforms, two),
// which drivers that compile at pipeline creation (SwiftShader, lavapipe) pay for.  The
// bias is read at index 0 where there is none (binding 1 then holds the parameters) and
// selected away; the residual's reads stay under their run-time switch (made
// unconditionally, lavapipe's load turns cost the pass more than the branch).  Element
// by element (not V4) the stores stay guarded, one local condition each: there, on
// SwiftShader, clamped stores cost more to create than the branches they replace.
void main() {
    int lane = int(gl_GlobalInvocationID.x);       // lanes run along (co, t / 4)
    int per_co = tiles.z >> 2;
    int co = lane / per_co;
    int t0 = (lane - co * per_co) * 4;
    if (co >= dims.z || t0 >= dims.w) return;
    int plane4 = dims.y * tiles.z / 4;
    int o4 = (co * tiles.z + t0) / 4;
    vec4 m[6][6];
    [[unroll]] for (int r = 0; r < 6; r++)
        [[unroll]] for (int c = 0; c < 6; c++) m[r][c] = LOAD4((r * 6 + c) * plane4 + o4);
    bool has_bias = out_size.w != 0;
    float bv = FLOAD(bias, has_bias ? uint(co * bias_step.x) : 0u);
    bv = has_bias ? bv : 0.0;
#ifndef POOL
    bool has_res = bias_step.y != 0;
    int last_h = out_size.x - 1, last_w = out_size.y - 1;
#endif
#ifdef V8
    vec4 pend[4];               // the even tile's rows, stored with the odd tile's
    uvec2 pend_h[4];            // (float16: its four halves)
    uint pend_i[4];
#endif
    [[unroll]] for (int q = 0; q < 4; q++) {
        int t = t0 + q;
        if (t >= dims.w) break;
        int n = t / tiles.y;
        int rem = t - n * tiles.y;
        int th = rem / tiles.x;
        int tw = rem - th * tiles.x;
        // A^T m: 4x6
        float e[4][6];
        [[unroll]] for (int c = 0; c < 6; c++) {
            float z[4] = output_at(float[6](m[0][c][q], m[1][c][q], m[2][c][q], m[3][c][q],
                                            m[4][c][q], m[5][c][q]));
            [[unroll]] for (int r = 0; r < 4; r++) e[r][c] = z[r];
        }
#if !defined(POOL) && defined(V4)
        // the rows past the output repeat the last one inside (th * 4 <= last_h)
        [[unroll]] for (int r = 1; r < 4; r++) {
            bool rin = th * 4 + r <= last_h;
            [[unroll]] for (int c = 0; c < 6; c++) e[r][c] = rin ? e[r][c] : e[r - 1][c];
        }
#endif
        uint yb = uint(n) * ys.x + uint(co) * ys.y;
#ifdef POOL
        float a[4][4];
#endif
        [[unroll]] for (int r = 0; r < 4; r++) {
            float v[4] = output_at(e[r]);
#ifdef POOL
            [[unroll]] for (int c = 0; c < 4; c++) a[r][c] = ROUND(vkml_activation(ACT, v[c] + bv, act));
#else
#ifdef V4
            uint oh = uint(min(th * 4 + r, last_h));
            uint i4 = (yb + oh * ys.z + uint(tw * 4)) >> 2;
            vec4 s = vec4(v[0], v[1], v[2], v[3]) + bv;
            if (has_res) {      // (a branch, not + 0.0: -0 + 0 = +0; V4: ys.w == 1)
#ifdef F32
                s += res4[i4];
#else
                uint rb = i4 << 2;
                s += vec4(FLOAD(res, rb), FLOAD(res, rb + 1u), FLOAD(res, rb + 2u),
                          FLOAD(res, rb + 3u));
#endif
            }
            vec4 o = vec4(vkml_activation(ACT, s.x, act), vkml_activation(ACT, s.y, act),
                          vkml_activation(ACT, s.z, act), vkml_activation(ACT, s.w, act));
#if (defined(F16) || defined(F16_PACKED)) && defined(V8)
            // (FSTORE's rounding: vkml_half_bits, the same on every driver)
            uvec2 h = uvec2(vkml_half_bits(o.x) | (vkml_half_bits(o.y) << 16),
                            vkml_half_bits(o.z) | (vkml_half_bits(o.w) << 16));
            if ((q & 1) == 0) {
                pend_h[r] = h;
                pend_i[r] = i4 >> 1;
            } else {
                y8h[pend_i[r]] = vkml_u64x2(uvec4(pend_h[r], h));
            }
#elif defined(F16) || defined(F16_PACKED)
            // (FSTORE's rounding: vkml_half_bits, the same on every driver)
            y2[i4] = uvec2(vkml_half_bits(o.x) | (vkml_half_bits(o.y) << 16),
                           vkml_half_bits(o.z) | (vkml_half_bits(o.w) << 16));
#elif defined(V8)
            if ((q & 1) == 0) {
                pend[r] = o;
                pend_i[r] = i4 >> 1;
            } else {
                uvec4 a = floatBitsToUint(pend[r]), b = floatBitsToUint(o);
                y8[pend_i[r]] = vkml_u64x4(a, b);
            }
#else
            y4[i4] = o;
#endif
#else
            bool rok = th * 4 + r <= last_h;      // (locals, not `&&` on uniforms)
            [[unroll]] for (int c = 0; c < 4; c++) {
                int ow = tw * 4 + c;
                bool ok = ow <= last_w;
                ok = rok && ok;
                uint i = yb + uint(th * 4 + r) * ys.z + uint(ow) * ys.w;
                if (ok) {
                    float s = v[c] + bv;
                    if (has_res) s += FLOAD(res, i);
                    FSTORE(y, i, vkml_activation(ACT, s, act));
                }
            }
#endif
#endif
        }
#ifdef POOL
        // pooled row th*2 + pr reads conv rows th*4 + 2pr, + 1: both inside the
        // convolution's output wherever the pooled row is inside the pooled output (a
        // border tile may hold no pooled row at all: these stores stay guarded)
        [[unroll]] for (int pr = 0; pr < 2; pr++) {
            int ph = th * 2 + pr;
            bool rok = ph < out_size.x;
            [[unroll]] for (int pc = 0; pc < 2; pc++) {
                int pw = tw * 2 + pc;
                float w[4] = float[4](a[2 * pr][2 * pc], a[2 * pr][2 * pc + 1],
                                      a[2 * pr + 1][2 * pc], a[2 * pr + 1][2 * pc + 1]);
                float r = lp_window(w);
                bool ok = pw < out_size.y;
                ok = rok && ok;
                if (ok) FSTORE(y, yb + uint(ph) * ys.z + uint(pw) * ys.w, r);
            }
        }
#endif
    }
}
#endif

#ifdef GEMM
// M[p][co][t] = sum over ci of U[p][ci][co] V[p][ci][t], the 36 GEMMs with the lanes of
// a subgroup along output channels ("cl"): lane s computes MB channels (channel block
// cg * SG + s) x NB tiles, every lane of a subgroup the same NB tiles.  Those tiles' V
// values are fetched once a subgroup (lane s the float4 texel s of the block) and reach
// every lane by shuffles at constant lanes; each lane fetches its own channels' U as
// float4s.  This is gemm_sg's sharing turned around: Winograd's GEMMs have few tiles (a
// 56x56 image: 196) and 64-128 output channels, so the lanes fill with channel blocks
// where gemm_sg pads each GEMM's pixel blocks to whole subgroups.
layout(constant_id = 2) const int MB = 8;       // output channels per lane (x4)
layout(constant_id = 3) const int NB = 28;      // tiles per block (x4)
layout(constant_id = 4) const int SG = 8;       // subgroup size (full subgroups)
const int NT = NB / 4;                          // V texels of a block's row
const int NF = (NT + SG - 1) / SG;              // texels a lane fetches per channel

layout(set = 0, binding = 0) uniform samplerBuffer Vt;    // RGBA32F view of V
layout(set = 0, binding = 1) uniform samplerBuffer Ut;    // RGBA32F view of U
layout(std430, set = 0, binding = 2) writeonly buffer M4 { vec4 m4[]; };
#ifdef V8
// V8 (int64 shaders): eight tiles a u64vec4 (M's rows T8; a block of NB = 8a + 4 tiles
// starting 4 past a group stores a u64vec2 first)
layout(std430, set = 0, binding = 2) writeonly buffer M8 { u64vec4 m8[]; };
layout(std430, set = 0, binding = 2) writeonly buffer M8h { u64vec2 m8h[]; };
#endif

void main() {
    int sub = int(gl_SubgroupInvocationID);
    int blk = int(gl_WorkGroupID.x * (gl_WorkGroupSize.x / SG) + gl_SubgroupID);
    int t0 = blk * NB;
    int cin = dims.x, co_pad = dims.y, T = dims.w, mrow = tiles.z, vrow = tiles.w;
    if (t0 >= T) return;                                    // (whole subgroups)
    int p = int(gl_WorkGroupID.z);
    int co0 = (int(gl_WorkGroupID.y) * SG + sub) * MB;
    bool live = co0 < co_pad;
    co0 = min(co0, co_pad - MB);
    int vlast = (36 * cin * vrow) / 4 - 1;                  // (the block's tail: clamped)
    int vb = (p * cin * vrow + t0) / 4;
    int ub = (p * cin * co_pad + co0) / 4;
    vec4 acc[MB / 4][NB];
    [[unroll]] for (int i = 0; i < MB / 4; i++)
        [[unroll]] for (int j = 0; j < NB; j++) acc[i][j] = vec4(0.0);
    [[dont_unroll]] for (int ci = 0; ci < cin; ci++) {
        vec4 xv[NF];
        [[unroll]] for (int f = 0; f < NF; f++)
            xv[f] = texelFetch(Vt, min(vb + min(f * SG + sub, NT - 1), vlast));
        vec4 w[MB / 4];
        [[unroll]] for (int i = 0; i < MB / 4; i++) w[i] = texelFetch(Ut, ub + i);
        [[unroll]] for (int j = 0; j < NB; j++) {
            float x = subgroupShuffle(xv[(j / 4) / SG][j % 4], uint((j / 4) % SG));
            [[unroll]] for (int i = 0; i < MB / 4; i++) acc[i][j] = fma(w[i], vec4(x), acc[i][j]);
        }
        vb += vrow / 4;
        ub += co_pad / 4;
    }
    if (!live) return;
    [[unroll]] for (int i = 0; i < MB / 4; i++)
        [[unroll]] for (int c = 0; c < 4; c++) {
            uint row = uint((p * co_pad + co0 + i * 4 + c) * mrow + t0);
#ifdef V8
            const int N8 = NB / 8;
            const bool HALF = (NB & 7) != 0;
            bool odd = HALF && (t0 & 4) != 0;
            [[unroll]] for (int k = 0; k < N8; k++) {
                int j = (odd ? 4 : 0) + 8 * k;
                uvec4 u[2];
                [[unroll]] for (int q = 0; q < 8; q++)
                    u[q >> 2][q & 3] = floatBitsToUint(
                        HALF && odd ? acc[i][min(4 + 8 * k + q, NB - 1)][c] : acc[i][8 * k + q][c]);
                if (t0 + j < T) m8[(row + uint(j)) >> 3] = vkml_u64x4(u[0], u[1]);
            }
            if (HALF) {
                int j = odd ? 0 : 8 * N8;
                uvec4 u;
                [[unroll]] for (int q = 0; q < 4; q++)
                    u[q] = floatBitsToUint(odd ? acc[i][q][c] : acc[i][min(8 * N8 + q, NB - 1)][c]);
                if (t0 + j < T) m8h[(row + uint(j)) >> 2] = vkml_u64x2(u);
            }
#else
            [[unroll]] for (int j = 0; j < NB; j += 4)
                if (t0 + j < T)
                    m4[(row + uint(j)) >> 2] = vec4(acc[i][j][c], acc[i][j + 1][c],
                                                    acc[i][j + 2][c], acc[i][j + 3][c]);
#endif
        }
}
#endif
