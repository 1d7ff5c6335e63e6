// One element type per kernel variant, for kernels that compare and combine elements
// (pooling, reduce).  A variant defines one of
//   F32, F16, F16_PACKED          float tensors through vkml_float.glsl (arithmetic float32)
//   INT_BITS=8|16|32 [SIGNED=1]   integers in uint[] words, sign- or zero-extended to 32 bits
//   INT64=1 [SIGNED=1]            64-bit integers as (low, high) word pairs
// Integers go through 32-bit words whatever their width, so no variant needs 8/16-bit
// storage or shaderInt64 (SwiftShader has neither); sub-word stores change only their
// element's bits (vkml_index.glsl's atomics).
//   E_T              the buffer element type to declare (FSTORE_T or uint)
//   VAL              the value type (float, int, uint or uvec2)
//   ELOAD(B, i)      element i of buffer B as a VAL
//   ESTORE(B, i, v)  store VAL v as element i
//   EGT(a, b)        a orders after b; ELT(a, b) before.  A float NaN orders after (EGT)
//                    and before (ELT) every number, so a max or a min propagates the
//                    first NaN, as NumPy's and PyTorch's do.
//   ELOWEST / EHIGHEST  the extremes (-inf / +inf for floats)
//   EZERO / EONE, EADD, EMUL, EABS  wrapping integer arithmetic (floats: float32)
#ifndef VKML_ELEM_GLSL
#define VKML_ELEM_GLSL
#include "vkml_index.glsl"

#if defined(F32) || defined(F16) || defined(F16_PACKED)
#include "vkml_float.glsl"
#define E_FLOAT 1
#define E_T FSTORE_T
#define VAL float
#define ELOAD(B, i) FLOAD(B, i)
#define ESTORE(B, i, v) FSTORE(B, i, v)
bool egt(float a, float b) { return a > b || (isnan(a) && !isnan(b)); }
bool elt(float a, float b) { return a < b || (isnan(a) && !isnan(b)); }
#define ELOWEST uintBitsToFloat(0xFF800000u)
#define EHIGHEST uintBitsToFloat(0x7F800000u)
#define EZERO 0.0
#define EONE 1.0
#define EADD(a, b) ((a) + (b))
#define EMUL(a, b) ((a) * (b))
#define EABS(a) abs(a)

#elif defined(INT64)
#define E_T uint
#define VAL uvec2
#define ELOAD(B, i) uvec2(B[2u * (i)], B[2u * (i) + 1u])
#define ESTORE(B, i, v) { B[2u * (i)] = (v).x; B[2u * (i) + 1u] = (v).y; }
#ifdef SIGNED
bool egt(uvec2 a, uvec2 b) { return int(a.y) > int(b.y) || (a.y == b.y && a.x > b.x); }
#define ELOWEST uvec2(0u, 0x80000000u)
#define EHIGHEST uvec2(0xFFFFFFFFu, 0x7FFFFFFFu)
#else
bool egt(uvec2 a, uvec2 b) { return a.y > b.y || (a.y == b.y && a.x > b.x); }
#define ELOWEST uvec2(0u)
#define EHIGHEST uvec2(0xFFFFFFFFu)
#endif
bool elt(uvec2 a, uvec2 b) { return egt(b, a); }
uvec2 add64(uvec2 a, uvec2 b) {
    uint carry;
    uint lo = uaddCarry(a.x, b.x, carry);
    return uvec2(lo, a.y + b.y + carry);
}
// the low 64 bits of a * b (signed and unsigned alike)
uvec2 mul64(uvec2 a, uvec2 b) {
    uint hi, lo;
    umulExtended(a.x, b.x, hi, lo);
    return uvec2(lo, hi + a.x * b.y + a.y * b.x);
}
#ifdef SIGNED
uvec2 abs64(uvec2 a) { return int(a.y) < 0 ? add64(~a, uvec2(1u, 0u)) : a; }
#else
uvec2 abs64(uvec2 a) { return a; }
#endif
#define EZERO uvec2(0u)
#define EONE uvec2(1u, 0u)
#define EADD(a, b) add64(a, b)
#define EMUL(a, b) mul64(a, b)
#define EABS(a) abs64(a)

#else   // INT_BITS 8, 16 or 32
#define E_T uint
#define EMASK (INT_BITS == 32 ? 0xFFFFFFFFu : (1u << INT_BITS) - 1u)
#define EPER (32 / INT_BITS)
uint eword(uint w, uint i) {      // element i's bits from its word, at the bottom
    return INT_BITS == 32 ? w : (w >> ((i % EPER) * INT_BITS)) & EMASK;
}
#ifdef SIGNED
#define VAL int
#define ELOAD(B, i) bitfieldExtract(int(eword(B[(i) / EPER], (i))), 0, INT_BITS)
#define ELOWEST (-(1 << (INT_BITS - 1)))
#define EHIGHEST int(EMASK >> 1)
#define EZERO 0
#define EONE 1
#define EABS(a) abs(a)
#else
#define VAL uint
#define ELOAD(B, i) eword(B[(i) / EPER], (i))
#define ELOWEST 0u
#define EHIGHEST EMASK
#define EZERO 0u
#define EONE 1u
#define EABS(a) (a)
#endif
bool egt(VAL a, VAL b) { return a > b; }
bool elt(VAL a, VAL b) { return a < b; }
#define EADD(a, b) ((a) + (b))
#define EMUL(a, b) ((a) * (b))
#if INT_BITS == 32
#define ESTORE(B, i, v) B[i] = uint(v)
#elif INT_BITS == 16
#define ESTORE(B, i, v) VKML_ST16(B, i, uint(v))
#else
#define ESTORE(B, i, v) VKML_ST8(B, i, uint(v))
#endif
#endif

#define EGT(a, b) egt(a, b)
#define ELT(a, b) elt(a, b)
#endif
