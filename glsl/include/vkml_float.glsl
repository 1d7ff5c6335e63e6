// Float tensors in storage buffers, one kernel text for every storage precision.
//
// A variant defines exactly one of
//   F32         float32 tensors
//   F16         float16 tensors on a device with 16-bit storage (uint16_t elements)
//   F16_PACKED  float16 tensors on a device without it (two halves per uint word)
// and declares its buffers with element type FSTORE_T.  Arithmetic is always float32:
//   FLOAD(B, i)       element i of buffer B as a float
//   FSTORE(B, i, v)   store float v as element i (float16: round to nearest even, the
//                     same on every driver; packed: atomics touch only that half-word)
//   FSTORE2(B, i, a, b)  store elements i and i+1 (i even) in one write where possible
#ifndef VKML_FLOAT_GLSL
#define VKML_FLOAT_GLSL
#include "vkml_index.glsl"

#if defined(F16)
#extension GL_EXT_shader_16bit_storage : require
#define FSTORE_T uint16_t
#define FLOAD(B, i) vkml_half_float(uint(B[i]))
#define FSTORE(B, i, v) B[i] = uint16_t(vkml_half_bits(v))
#define FSTORE2(B, i, a, b) { B[i] = uint16_t(vkml_half_bits(a)); B[(i) + 1u] = uint16_t(vkml_half_bits(b)); }
#elif defined(F16_PACKED)
#define FSTORE_T uint
#define FLOAD(B, i) vkml_half_float(VKML_LD16(B, i))
#define FSTORE(B, i, v) VKML_ST16(B, i, vkml_half_bits(v))
#define FSTORE2(B, i, a, b) B[(i) >> 1] = vkml_half_bits(a) | (vkml_half_bits(b) << 16)
#else
#define FSTORE_T float
#define FLOAD(B, i) B[i]
#define FSTORE(B, i, v) B[i] = (v)
#define FSTORE2(B, i, a, b) { B[i] = (a); B[(i) + 1u] = (b); }
#endif

#endif
