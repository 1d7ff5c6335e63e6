#version 450
// DML_CONVOLUTION_OPERATOR_DESC, every configuration: the reference kernel and the
// fallback of the fast paths.  One invocation computes one output element; the
// 1/2/3-D cases are all 3-D here (missing spatial dimensions have size 1).  Tensors
// are read and written through their DML element strides, so any layout works.
//
//   forward:  y[n,co,o] = sum_{ci,k} x[n, g*Cig+ci, o*stride + k*dilation - start]
//                                    * w[co, ci, flip(k)]
//   backward: y[n,co,o] = sum_{ci,k : o + start - k*dilation = i*stride}
//                                    x[n, g*Cig+ci, i] * w[g*Cig+ci, co - g*Cog, flip(k)]
// (g = co / Cog, Cig = C_in / groups, Cog = C_out / groups; flip(k) = K-1-k in the
// CONVOLUTION mode.)  Then bias, then the fused activation, then one store.
//
// Only outputs o in [vlo, vhi) per axis are computed (the others have no contribution:
// bias and activation only); the host (ops/convolution/geometry.py, _axis_forward/_backward)
// rebases the geometry to o - vlo, trims the input (x_off) and the taps (w_off) to the
// ones that reach the output, so that every index below fits int32 exactly.
//
// vkml:variant convolution_direct_f32 F32=1
// vkml:variant convolution_direct_f16 F16=1
// vkml:variant convolution_direct_f16_packed F16_PACKED=1
// vkml:variant convolution_direct_f32_res F32=1 RES=1
// vkml:variant convolution_direct_f16_res F16=1 RES=1
// vkml:variant convolution_direct_f16_packed_res F16_PACKED=1 RES=1
#include "vkml_float.glsl"
#include "vkml_activation.glsl"

layout(local_size_x_id = 0) in;
// Frozen into the module by the host (vkml.runtime.spirv), for drivers that do not fold
// specialization constants before generating code: ACT selects code in vkml_activation.glsl's
// switch, which SwiftShader otherwise runs case by case.
// vkml:frozen ACT
layout(constant_id = 1) const int ACT = 0;          // ACT_* of vkml_activation.glsl
layout(constant_id = 2) const bool BACKWARD = false;

layout(std430, set = 0, binding = 0) readonly buffer X { FSTORE_T x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { FSTORE_T w[]; };
layout(std430, set = 0, binding = 2) readonly buffer B { FSTORE_T b[]; };
layout(std430, set = 0, binding = 3) buffer Y { FSTORE_T y[]; };
#ifdef RES
// a graph's residual fusion (vkml/ops/graph.py): R laid out as the output (same type and
// element strides, bound at the output's window) added after the bias
layout(std430, set = 0, binding = 5) readonly buffer Res { FSTORE_T res[]; };
#endif
layout(std140, set = 0, binding = 4) uniform Params {
    ivec4 in_size;      // D, H, W, C_in / groups
    ivec4 out_size;     // D, H, W, C_out
    ivec4 ksize;        // KD, KH, KW, C_out / groups
    ivec4 stride;       // d, h, w, flip (CONVOLUTION mode)
    ivec4 dil;          // d, h, w, has bias
    ivec4 pad;          // start padding d, h, w
    ivec4 valid;        // vhi: outputs at or past it have no contribution (output_padding)
    uvec4 xs;           // input strides n, c, d, h
    uvec4 ys;           // output strides n, c, d, h
    uvec4 ws;           // filter strides 0, 1, kd, kh
    uvec4 ws_last;      // x w, y w, filter kw, bias c
    vec4 act;           // activation parameters
    ivec4 vlo;          // first output with a contribution d, h, w
    uvec4 offs;         // filter element offset, input element offset, -, -
};
layout(push_constant) uniform Push {
    uvec4 origin;       // first ow, oh, z (z = (n * C_out + co) * OD + od) of this dispatch
    uint x_base, y_base;   // element index of the first element bound of X and Y
};

void main() {
    uint ow = origin.x + gl_GlobalInvocationID.x;
    if (ow >= uint(out_size.z)) return;
    // Everything but ow is the same for the whole workgroup (uniform index math).
    uint oh = origin.y + gl_WorkGroupID.y;
    uint z = origin.z + gl_WorkGroupID.z;
    uint od = z % uint(out_size.x);
    z /= uint(out_size.x);
    uint co = z % uint(out_size.w);
    uint n = z / uint(out_size.w);
    int cig = in_size.w, cog = ksize.w;
    uint g = co / uint(cog);
    uint c0 = g * uint(cig);
    bool flip = stride.w != 0;
    float acc = 0.0;
    uint xn = n * xs.x + c0 * xs.y - x_base + offs.y;
    // (out_size < 2^31: the host refuses larger outputs)
    int o[3] = int[3](int(od) - vlo.x, int(oh) - vlo.y, int(ow) - vlo.z);
    bool live = o[0] >= 0 && o[1] >= 0 && o[2] >= 0
        && int(od) < valid.x && int(oh) < valid.y && int(ow) < valid.z;
    if (!live) {
    } else if (!BACKWARD) {
        {
            for (int kd = 0; kd < ksize.x; kd++) {
                int id = o[0] * stride.x - pad.x + kd * dil.x;
                if (id < 0 || id >= in_size.x) continue;
                for (int kh = 0; kh < ksize.y; kh++) {
                    int ih = o[1] * stride.y - pad.y + kh * dil.y;
                    if (ih < 0 || ih >= in_size.y) continue;
                    for (int kw = 0; kw < ksize.z; kw++) {
                        int iw = o[2] * stride.z - pad.z + kw * dil.z;
                        if (iw < 0 || iw >= in_size.z) continue;
                        uint xi = xn + uint(id) * xs.z + uint(ih) * xs.w + uint(iw) * ws_last.x;
                        uint wi = offs.x + co * ws.x
                            + uint(flip ? ksize.x - 1 - kd : kd) * ws.z
                            + uint(flip ? ksize.y - 1 - kh : kh) * ws.w
                            + uint(flip ? ksize.z - 1 - kw : kw) * ws_last.z;
                        for (int ci = 0; ci < cig; ci++) {
                            acc += FLOAD(x, xi) * FLOAD(w, wi);
                            xi += xs.y;
                            wi += ws.y;
                        }
                    }
                }
            }
        }
    } else {
        uint col = co - g * uint(cog);
        for (int kd = 0; kd < ksize.x; kd++) {
            int td = o[0] + pad.x - kd * dil.x;
            if (td < 0 || td % stride.x != 0 || td / stride.x >= in_size.x) continue;
            int id = td / stride.x;
            for (int kh = 0; kh < ksize.y; kh++) {
                int th = o[1] + pad.y - kh * dil.y;
                if (th < 0 || th % stride.y != 0 || th / stride.y >= in_size.y) continue;
                int ih = th / stride.y;
                for (int kw = 0; kw < ksize.z; kw++) {
                    int tw = o[2] + pad.z - kw * dil.z;
                    if (tw < 0 || tw % stride.z != 0 || tw / stride.z >= in_size.z) continue;
                    int iw = tw / stride.z;
                    uint xi = xn + uint(id) * xs.z + uint(ih) * xs.w + uint(iw) * ws_last.x;
                    uint wi = offs.x + c0 * ws.x + col * ws.y
                        + uint(flip ? ksize.x - 1 - kd : kd) * ws.z
                        + uint(flip ? ksize.y - 1 - kh : kh) * ws.w
                        + uint(flip ? ksize.z - 1 - kw : kw) * ws_last.z;
                    for (int ci = 0; ci < cig; ci++) {
                        acc += FLOAD(x, xi) * FLOAD(w, wi);
                        xi += xs.y;
                        wi += ws.x;
                    }
                }
            }
        }
    }
    if (dil.w != 0) acc += FLOAD(b, co * ws_last.w);
#define Y_INDEX (n * ys.x + co * ys.y + od * ys.z + oh * ys.w + ow * ws_last.y - y_base)
#ifdef RES
    acc += FLOAD(res, Y_INDEX);
#endif
    float v = vkml_activation(ACT, acc, act);
    uint yi = Y_INDEX;
    FSTORE(y, yi, v);
}
