// The one kernel of package pairreduce: after the peer's gradients have
// arrived in this GPU's inbox (copied there by the peer's copy engine),
// g = (g + inbox) * scale. Both GPUs of a pair add the same two numbers
// (IEEE addition is commutative) and multiply by the same scale, so both
// get the same bits. Generated PTX: pair.ptx (`make ptx`).

extern "C" __global__ void pair_sum(float *g, const float *in, long long n, float scale) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	long long stride = (long long)gridDim.x * blockDim.x;
	if ((((unsigned long long)g | (unsigned long long)in) & 15) == 0) {
		// Aligned: four floats per load (bandwidth; this runs beside GEMMs).
		long long n4 = n / 4;
		float4 *g4 = (float4 *)g;
		const float4 *in4 = (const float4 *)in;
		for (long long j = i; j < n4; j += stride) {
			float4 a = g4[j];
			float4 b = __ldcs(in4 + j); // read once: do not keep it in L2
			a.x = __fmul_rn(__fadd_rn(a.x, b.x), scale);
			a.y = __fmul_rn(__fadd_rn(a.y, b.y), scale);
			a.z = __fmul_rn(__fadd_rn(a.z, b.z), scale);
			a.w = __fmul_rn(__fadd_rn(a.w, b.w), scale);
			g4[j] = a;
		}
		for (long long j = 4 * n4 + i; j < n; j += stride) {
			g[j] = __fmul_rn(__fadd_rn(g[j], in[j]), scale);
		}
		return;
	}
	for (long long j = i; j < n; j += stride) {
		g[j] = __fmul_rn(__fadd_rn(g[j], in[j]), scale);
	}
}
