// 32-bit words stored as 64-bit components: eight as one u64vec4, four as one u64vec2.
// lavapipe stores a vector in one lane turn and, within it, one scalar store per
// component, so 64-bit components carry twice the bytes for the same cost
// (docs/DEVELOPING.md, "u64vec4 stores"; vkml/ops/store_width.py times it per device).
// Include after enabling GL_ARB_gpu_shader_int64.
#ifndef VKML_U64_GLSL
#define VKML_U64_GLSL

u64vec4 vkml_u64x4(uvec4 lo, uvec4 hi) {
    return u64vec4(pack64(lo.xy), pack64(lo.zw), pack64(hi.xy), pack64(hi.zw));
}

u64vec2 vkml_u64x2(uvec4 v) {
    return u64vec2(pack64(v.xy), pack64(v.zw));
}

// The eight float32 a u64vec4 holds (eight floats loaded in one lane turn)
void vkml_u64_floats(u64vec4 v, out float f[8]) {
    for (int i = 0; i < 4; i++) {
        uvec2 w = unpack32(v[i]);
        f[2 * i] = uintBitsToFloat(w.x);
        f[2 * i + 1] = uintBitsToFloat(w.y);
    }
}

#endif
