// The box of coordinates a dispatch of a grid kernel covers (vkml/ops/grid.py, BoxKernel):
// the host splits a box until every dispatch fits the device, and passes each piece here.
// Grid: x runs along the last XDIMS dimensions (V elements of the last per invocation),
// y the one before, z the rest, so every coordinate but x's is the same for a workgroup.
// box_outside and box_coord need RANK, XDIMS and V declared before the include
// (VKML_BOX_COORD defined); the push block alone needs nothing.
#ifndef VKML_BOX_GLSL
#define VKML_BOX_GLSL

layout(push_constant) uniform Push {
    uvec4 origin[2];
    uvec4 extent[2];
    uint in_base, out_base;       // element index of the first bound element
    uint x_count;                 // invocations along x
    uvec4 magic[2];               // ceil(2^32 / extent): see divide()
};

#define AT(arr, d) arr[(d) >> 2][(d) & 3]

// a / extent[d] for a < 2^16 (the host keeps grid coordinates below it): the high word of
// a * ceil(2^32 / extent), exact there.  lavapipe runs an integer division as one scalar
// division per lane; the multiply-high is a vector instruction.
uint divide(uint a, int d) {
    uint hi, lo;
    umulExtended(a, AT(magic, d), hi, lo);
    return AT(extent, d) == 1u ? a : hi;
}

#ifdef VKML_BOX_COORD
// Whether this invocation lies outside the box (the grid rounds x and y up to workgroups).
bool box_outside() {
    const int YDIM = RANK - XDIMS - 1;
    return gl_GlobalInvocationID.x >= x_count
        || (YDIM >= 0 && gl_GlobalInvocationID.y >= AT(extent, YDIM));
}

// The coordinates of this invocation's first element (the last dimension's V elements
// from coord[RANK - 1]): z divided into the dimensions before y's, x into the last XDIMS.
// A global, not an out parameter: that would copy the array in and out.
uint coord[8];
void box_coord() {
    const int YDIM = RANK - XDIMS - 1;
    uint gx = gl_GlobalInvocationID.x;
    uint z = gl_GlobalInvocationID.z;
    [[unroll]] for (int d = YDIM - 1; d >= 0; d--) {
        uint q = divide(z, d);
        coord[d] = AT(origin, d) + z - q * AT(extent, d);
        z = q;
    }
    if (YDIM >= 0) coord[YDIM] = AT(origin, YDIM) + gl_GlobalInvocationID.y;
    [[unroll]] for (int d = RANK - 1; d > YDIM; d--) {
        if (d == YDIM + 1) {          // the outermost x dimension: gx < its extent
            coord[d] = AT(origin, d) + gx * V;
        } else {
            uint q = divide(gx, d);
            coord[d] = AT(origin, d) + gx - q * AT(extent, d);
            gx = q;
        }
    }
}
#endif

#endif
