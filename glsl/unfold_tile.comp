#version 450
// Unfold (im2col, see glsl/unfold.comp) of 4-byte elements over 2 spatial dimensions
// through a shared-memory tile ("tile"): the workgroup covers LOCAL_SIZE_Y block rows x
// 4 LOCAL_SIZE_X block columns of one (n, c); it first copies the input those blocks'
// windows read (with the halo, 0 in the padding) into shared memory, each element once,
// barrier, then each invocation writes the K output rows of its 4 neighbouring blocks
// (uvec4 stores where aligned).  Rolled loops, no local arrays; the grid's x runs along
// the last block dimension only.  The host keeps the tile within
// maxComputeSharedMemorySize.
//
// vkml:variant unfold_e4_tile

layout(std430, set = 0, binding = 0) readonly buffer In { uint x[]; };
layout(std430, set = 0, binding = 1) buffer Out { uint y[]; };
layout(std430, set = 0, binding = 1) buffer Out4 { uvec4 y4[]; };

layout(local_size_x_id = 0, local_size_y_id = 23) in;
layout(constant_id = 1) const int RANK = 4;      // the box: N, C, 2 block dimensions
layout(constant_id = 2) const int XDIMS = 1;     // always 1 here
#define VKML_WINDOW_DIMS 2
#include "vkml_window.glsl"
layout(constant_id = 21) const uint V = 4u;      // 4 (1 on short rows)
layout(constant_id = 22) const bool VEC_STORE = false;
layout(constant_id = 25) const uint TILE_SIZE = 1u;   // elements of the tile: HB * IL
shared uint tile[TILE_SIZE];

layout(std140, set = 0, binding = 2) uniform Params {
    uvec4 out_stride[2];          // N, output row (.y), block dimensions
    uvec4 in_stride[2];           // N, C, spatial
    uvec4 in_size[2];             // spatial sizes
    ivec4 start[2];               // StartPadding
    uint in_texels;
};

#include "vkml_box.glsl"

const uint K = W0 * W1;

void main() {
    uint gx = gl_GlobalInvocationID.x;
    uint gy = gl_GlobalInvocationID.y;
    bool live = gx < x_count && gy < extent[0].z;
    uint z = gl_GlobalInvocationID.z;
    uint q = divide(z, 1);
    uint cc = origin[0].y + z - q * extent[0].y;
    uint cn = origin[0].x + q;
    uint bb = origin[0].z + gy;
    uint bl = origin[0].w + gx * V;
    uint count = min(V, origin[0].w + extent[0].w - bl);

    uint lx = gl_WorkGroupSize.x, ly = gl_WorkGroupSize.y;
    uint hb = (ly - 1u) * S0 + (W0 - 1u) * L0 + 1u;
    uint il = ((lx - 1u) * V + 3u) * S1 + (W1 - 1u) * L1 + 1u;
    uint row0 = origin[0].z + gl_WorkGroupID.y * ly;
    uint col0 = origin[0].w + gl_WorkGroupID.x * lx * V;
    int tb0 = int(row0 * S0) - start[0].x;
    int tl0 = int(col0 * S1) - start[0].y;
    uint base = cn * in_stride[0].x + cc * in_stride[0].y - in_base;
    for (uint r = gl_LocalInvocationID.y; r < hb; r += ly) {
        int ib = tb0 + int(r);
        bool okr = uint(ib) < in_size[0].x;
        uint src = base + uint(ib) * in_stride[0].z;
        for (uint c = gl_LocalInvocationID.x; c < il; c += lx) {
            uint i = uint(tl0 + int(c));
            uint at = src + i * in_stride[0].w;
            bool ok = okr && i < in_size[0].y && at < uint(x.length());   // inside the binding
            uint v = x[ok ? at : 0u];
            tile[r * il + c] = ok ? v : 0u;
        }
    }
    barrier();
    if (!live) return;

    uint o = cn * out_stride[0].x + cc * K * out_stride[0].y + bb * out_stride[0].z
             + bl * out_stride[0].w - out_base;
    uint ostep = out_stride[0].w;
    uint t0 = gl_LocalInvocationID.y * S0 * il + gl_LocalInvocationID.x * V * S1;
    uint k = 0u;
    for (uint k0 = 0u; k0 < W0; k0++) {
        for (uint k1 = 0u; k1 < W1; k1++, k++) {
            uint t = t0 + k0 * L0 * il + k1 * L1;
            uvec4 v = uvec4(tile[t], tile[t + S1], tile[t + 2u * S1], tile[t + 3u * S1]);
            uint ok_ = o + k * out_stride[0].y;
            if (VEC_STORE && count == 4u) {
                y4[ok_ >> 2] = v;
            } else {
                for (uint j = 0u; j < count; j++) y[ok_ + j * ostep] = v[j];
            }
        }
    }
}
