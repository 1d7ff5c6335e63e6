// Shared helpers for vkml kernels: grid-stride loops and storage-width access.
//
// A kernel that covers `count` items from `first` loops with
//     for (uint i = first + gl_GlobalInvocationID.x; i < first + count; i += stride)
// where `stride` (invocations in the dispatch) comes in a push constant, so one dispatch
// of at most maxComputeWorkGroupCount groups covers any count.  (Not gl_NumWorkGroups:
// lavapipe reloads it every iteration.)
// Kernel parameters go in uniform buffers (std140), not storage buffers: lavapipe
// scalarizes storage-buffer loads per lane even at uniform offsets.
#ifndef VKML_INDEX_GLSL
#define VKML_INDEX_GLSL

// Sub-word elements in uint[] buffers, for devices without 8/16-bit storage.
// Loads extract the element from its 32-bit word; stores change only the element's
// bits with atomicAnd/atomicOr, so neighbours written by other invocations survive.
// The atomicAnd clears only the element's bits that are 0 in the value (its operand
// holds the value), so neither atomic can be issued before the value is known.  Run in
// place (the output bound to an input's memory), an atomicAnd clearing the whole element,
// which depends on nothing loaded, could go ahead of the load of that element's input and
// make it read 0: an NVIDIA GPU did so for 8-bit in-place ADD and CLIP (the Aliased
// decoration did not stop it); the CPU drivers run them in program order.
#define VKML_LD16(B, i) ((B[(i) >> 1] >> (((i) & 1u) << 4)) & 0xFFFFu)
#define VKML_LD8(B, i)  ((B[(i) >> 2] >> (((i) & 3u) << 3)) & 0xFFu)
#define VKML_ST16(B, i, v) { uint vkml_s_ = ((i) & 1u) << 4; \
    uint vkml_v_ = ((v) & 0xFFFFu) << vkml_s_; \
    atomicAnd(B[(i) >> 1], vkml_v_ | ~(0xFFFFu << vkml_s_)); atomicOr(B[(i) >> 1], vkml_v_); }
#define VKML_ST8(B, i, v) { uint vkml_s_ = ((i) & 3u) << 3; \
    uint vkml_v_ = ((v) & 0xFFu) << vkml_s_; \
    atomicAnd(B[(i) >> 2], vkml_v_ | ~(0xFFu << vkml_s_)); atomicOr(B[(i) >> 2], vkml_v_); }

// float32 -> float16 bits, round to nearest even, the same on every driver
// (a driver's own conversion may round toward zero).  Overflow gives +-inf, NaN stays NaN.
uint vkml_half_bits(float f) {
    uint x = floatBitsToUint(f);
    uint sign = (x >> 16) & 0x8000u;
    uint ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) {                      // inf or NaN
        return sign | 0x7C00u | ((ax > 0x7F800000u) ? 0x200u : 0u);
    }
    if (ax >= 0x477FF000u) return sign | 0x7C00u; // rounds past 65504
    if (ax < 0x38800000u) {                       // below the smallest normal half
        if (ax < 0x33000000u) return sign;        // below half the smallest subnormal
        uint e = ax >> 23;
        uint m = (ax & 0x7FFFFFu) | 0x800000u;
        uint shift = 126u - e;                    // 14..24
        uint q = m >> shift;
        uint rem = m & ((1u << shift) - 1u);
        uint halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u) != 0u)) q += 1u;
        return sign | q;
    }
    uint r = ax - 0x38000000u;                    // rebias the exponent (127 -> 15)
    uint q = r >> 13;
    uint rem = r & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u) != 0u)) q += 1u;
    return sign | q;
}

float vkml_half_float(uint h) { return unpackHalf2x16(h & 0xFFFFu).x; }

#endif
