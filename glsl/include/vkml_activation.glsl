// Fused activations (dml-fused-activations.md), applied by a kernel to its result before
// the store, so an activation costs no second pass over memory.
//
//   float vkml_activation(int kind, float x, vec4 p)
//
// `kind` is ACT_* (the kernel_id column of vkml/dml/activations.py's table; pass it as a
// specialization constant so the switch folds away); `p` holds the parameters in the
// order of ActivationDesc.kernel_parameters().  Formulas are those of each page, written
// to stay finite where the literal form overflows in float32 (exp of a large argument).
#ifndef VKML_ACTIVATION_GLSL
#define VKML_ACTIVATION_GLSL

const int ACT_NONE = 0;
const int ACT_LINEAR = 1;              // p: alpha, beta
const int ACT_SIGMOID = 2;
const int ACT_HARD_SIGMOID = 3;        // p: alpha, beta
const int ACT_TANH = 4;
const int ACT_SCALED_TANH = 5;         // p: alpha, beta
const int ACT_RELU = 6;
const int ACT_LEAKY_RELU = 7;          // p: alpha
const int ACT_THRESHOLDED_RELU = 8;    // p: alpha
const int ACT_ELU = 9;                 // p: alpha
const int ACT_CELU = 10;               // p: alpha
const int ACT_SCALED_ELU = 11;         // p: alpha, gamma
const int ACT_SOFTPLUS = 12;           // p: steepness
const int ACT_PARAMETRIC_SOFTPLUS = 13;// p: alpha, beta
const int ACT_SOFTSIGN = 14;
const int ACT_IDENTITY = 15;
const int ACT_SHRINK = 16;             // p: bias, threshold
const int ACT_GELU = 17;
const int ACT_CLIP = 18;               // p: scale, bias, min, max
// Operators only (not on the fused-activation page): no fused kernel is given these.
const int ACT_SWISH = 19;              // p: sigmoid_input_scale
const int ACT_HARD_SWISH = 20;         // p: alpha, beta

// tanh(x) = (1 - e^(-2|x|)) / (1 + e^(-2|x|)) with the sign of x: finite for every x
// (the textbook (e^x - e^-x) / (e^x + e^-x) is inf/inf past |x| ~ 44); near 0 the
// cancellation in 1 - e^(-2|x|) is avoided by the series x - x^3/3.
float vkml_tanh(float x) {
    float a = abs(x);
    if (a < 0.01) return x * (1.0 - x * x * (1.0 / 3.0));
    float t = exp(-2.0 * a);
    return sign(x) * ((1.0 - t) / (1.0 + t));
}

// ln(1 + e^z) = max(z, 0) + ln(1 + e^-|z|): no overflow for large z.
float vkml_softplus(float z) {
    return max(z, 0.0) + log(1.0 + exp(-abs(z)));
}

// erfc(a) for a >= 0, Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7).
float vkml_erfc_pos(float a) {
    float t = 1.0 / (1.0 + 0.3275911 * a);
    float poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741
               + t * (-1.453152027 + t * 1.061405429))));
    return poly * exp(-a * a);
}

// 0.5 x (1 + erf(x / sqrt 2)); for x < 0 written with erfc so the small result keeps
// its relative precision.
float vkml_gelu(float x) {
    float e = vkml_erfc_pos(abs(x) * 0.70710678118654752);
    return x >= 0.0 ? 0.5 * x * (2.0 - e) : 0.5 * x * e;
}

float vkml_activation(int kind, float x, vec4 p) {
    switch (kind) {
    case ACT_LINEAR: return p.x * x + p.y;
    case ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case ACT_HARD_SIGMOID: return max(0.0, min(p.x * x + p.y, 1.0));
    case ACT_TANH: return vkml_tanh(x);
    case ACT_SCALED_TANH: return p.x * vkml_tanh(p.y * x);
    case ACT_RELU: return max(0.0, x);
    case ACT_LEAKY_RELU: return x >= 0.0 ? x : p.x * x;
    case ACT_THRESHOLDED_RELU: return x > p.x ? x : 0.0;
    case ACT_ELU: return x >= 0.0 ? x : p.x * (exp(x) - 1.0);
    case ACT_CELU: return max(0.0, x) + min(0.0, p.x * (exp(min(x / p.x, 80.0)) - 1.0));
    case ACT_SCALED_ELU: return x > 0.0 ? p.y * x : p.y * (p.x * exp(x) - p.x);
    case ACT_SOFTPLUS: return vkml_softplus(p.x * x) / p.x;
    case ACT_PARAMETRIC_SOFTPLUS: return p.x * vkml_softplus(p.y * x);
    case ACT_SOFTSIGN: return x / (1.0 + abs(x));
    case ACT_SHRINK: return x > p.y ? x - p.x : (x < -p.y ? x + p.x : 0.0);
    case ACT_GELU: return vkml_gelu(x);
    case ACT_CLIP: return min(p.w, max(p.z, x * p.x + p.y));
    // x / (1 + e^(-s x)): for a large -s x the denominator is inf and the result 0
    case ACT_SWISH: return x / (1.0 + exp(-p.x * x));
    case ACT_HARD_SWISH: return x * max(0.0, min(p.x * x + p.y, 1.0));
    default: return x;      // ACT_NONE, ACT_IDENTITY
    }
}

#endif
