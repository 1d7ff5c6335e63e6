#version 450
// Forward filters from DML's packed {C_out, C_in/groups, KD, KH, KW} to the implicit
// GEMM's [group][kd][kh][channel][kw][output channel padded to the block], as a blocked
// transpose: each invocation reads a 4 x 4 block (four output channels, four
// consecutive (channel, kd, kh, kw) positions, one float4 texel per channel) and writes
// it transposed (one float4 per position).
//
// (kd, kh, kw) are reversed in the CONVOLUTION mode; output channels past C_out/groups
// are zero.  Kernel sizes are specialization constants so the position decomposition
// divides by constants.
//
// vkml:variant convolution_filter_texel F32=1
#include "vkml_float.glsl"

layout(local_size_x_id = 0) in;
layout(constant_id = 1) const int KD = 1;
layout(constant_id = 2) const int KH = 3;
layout(constant_id = 3) const int KW = 3;
layout(constant_id = 4) const bool FLIP = false;

layout(set = 0, binding = 0) uniform samplerBuffer W;     // RGBA32F or RGBA16F view
layout(std430, set = 0, binding = 1) writeonly buffer Dst { vec4 dst4[]; };
layout(std140, set = 0, binding = 2) uniform Params {
    ivec4 dims;      // C_in / groups, C_out / groups, padded C_out / groups, K (= Cig*KD*KH*KW)
    ivec4 groups;    // groups, -, -, -
};

void main() {
    // Lanes along output channels: a lane-group's stores fill consecutive float4 of one
    // destination row, and the next workgroup (next 4 positions) reads the next float4
    // of the same filter rows, still in cache.
    int cb = int(gl_GlobalInvocationID.x);         // block of 4 padded output channels
    if (cb * 4 >= groups.x * dims.z) return;
    int K = dims.w;
    int k0 = int(gl_WorkGroupID.y) * 4;
    int co_pad = dims.z, cog = dims.y;
    int g = (cb * 4) / co_pad;
    int col = cb * 4 - g * co_pad;                 // within the group
    vec4 w[4];                                     // w[channel][position]
    for (int c = 0; c < 4; c++) {
        int co = col + c;
        w[c] = co < cog ? texelFetch(W, ((g * cog + co) * K + k0) >> 2) : vec4(0.0);
    }
    int group_base = g * K * co_pad;
    for (int e = 0; e < 4; e++) {
        int k = k0 + e;
        int kw = k % KW;
        int r = k / KW;
        int kh = r % KH;
        r /= KH;
        int kd = r % KD;
        int ci = r / KD;
        if (FLIP) { kd = KD - 1 - kd; kh = KH - 1 - kh; kw = KW - 1 - kw; }
        int row = ((kd * KH + kh) * dims.x + ci) * KW + kw;
        dst4[(group_base + row * co_pad + col) >> 2] = vec4(w[0][e], w[1][e], w[2][e], w[3][e]);
    }
}
