// The CUDA kernels of gotrain's MLP example (examples/mlp). cuBLAS does the
// GEMMs; these do everything else. No CUDA headers: bfloat16 is handled as
// its bits (unsigned short), so the file compiles with plain nvcc -ptx.
//
// Regenerate the PTX beside this file with `make ptx` (nvcc -ptx -arch=sm_90)
// on a machine with nvcc; the Go code embeds mlp.ptx.
//
// Element-wise kernels use grid-stride loops: any grid size is correct.

#define GRID_STRIDE(i, n) \
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
	     i += (long long)blockDim.x * gridDim.x)

__device__ __forceinline__ unsigned short f32_bf16_bits(float v) {
	unsigned int b = __float_as_uint(v);
	if ((b & 0x7fffffffu) > 0x7f800000u) { // NaN stays a quiet NaN
		return (unsigned short)((b >> 16) | 0x40u);
	}
	b += 0x7fffu + ((b >> 16) & 1u); // round to nearest, ties to even
	return (unsigned short)(b >> 16);
}

__device__ __forceinline__ float bf16_bits_f32(unsigned short h) {
	return __uint_as_float(((unsigned int)h) << 16);
}

// y[r][c] += b[c] for a rows×cols row-major y; then ReLU when relu != 0.
// When y16 is not null it also receives y as bfloat16 (the next GEMM's input).
extern "C" __global__ void bias_act(float *y, const float *b, int rows, int cols, int relu,
				    unsigned short *y16) {
	long long n = (long long)rows * cols;
	GRID_STRIDE(i, n) {
		float v = y[i] + b[i % cols];
		if (relu && v < 0.0f) v = 0.0f;
		y[i] = v;
		if (y16) y16[i] = f32_bf16_bits(v);
	}
}

// dy[i] = 0 where the ReLU's output y[i] was not positive. When dy16 is not
// null it also receives dy as bfloat16.
extern "C" __global__ void relu_bwd(float *dy, const float *y, long long n, unsigned short *dy16) {
	GRID_STRIDE(i, n) {
		float g = y[i] > 0.0f ? dy[i] : 0.0f;
		dy[i] = g;
		if (dy16) dy16[i] = f32_bf16_bits(g);
	}
}

// Softmax cross-entropy of each row of logits (rows×cols) against its label:
// loss[r] = logsumexp(row) - row[label], and the gradient of scale × sum(loss)
// in dlogits: scale × (softmax(row) - onehot(label)). One block per row;
// blockDim.x must be a power of two of at most 1024.
extern "C" __global__ void softmax_xent(const float *logits, const int *labels, float *dlogits,
					float *loss, int rows, int cols, float scale) {
	__shared__ float red[1024];
	int r = blockIdx.x;
	if (r >= rows) return;
	const float *x = logits + (long long)r * cols;
	float *d = dlogits + (long long)r * cols;
	int t = threadIdx.x, nt = blockDim.x;

	float m = -3.402823466e38f;
	for (int c = t; c < cols; c += nt) m = fmaxf(m, x[c]);
	red[t] = m;
	__syncthreads();
	for (int s = nt / 2; s > 0; s >>= 1) {
		if (t < s) red[t] = fmaxf(red[t], red[t + s]);
		__syncthreads();
	}
	m = red[0];
	__syncthreads();

	float sum = 0.0f;
	for (int c = t; c < cols; c += nt) sum += expf(x[c] - m);
	red[t] = sum;
	__syncthreads();
	for (int s = nt / 2; s > 0; s >>= 1) {
		if (t < s) red[t] += red[t + s];
		__syncthreads();
	}
	sum = red[0];

	int label = labels[r];
	float inv = 1.0f / sum;
	for (int c = t; c < cols; c += nt) {
		float p = expf(x[c] - m) * inv;
		d[c] = scale * (p - (c == label ? 1.0f : 0.0f));
	}
	if (t == 0) loss[r] = logf(sum) + m - x[label];
}

// db[c] = beta × db[c] + sum over rows of dy[r][c] (dy rows×cols row-major).
// blockDim (32, 8); grid.x = ceil(cols / 32).
extern "C" __global__ void bias_grad(float *db, const float *dy, int rows, int cols, float beta) {
	__shared__ float part[8][33];
	int c = blockIdx.x * 32 + threadIdx.x;
	float s = 0.0f;
	if (c < cols) {
		for (int r = threadIdx.y; r < rows; r += 8) s += dy[(long long)r * cols + c];
	}
	part[threadIdx.y][threadIdx.x] = s;
	__syncthreads();
	if (threadIdx.y == 0 && c < cols) {
		float t = 0.0f;
		for (int k = 0; k < 8; k++) t += part[k][threadIdx.x];
		db[c] = beta == 0.0f ? t : beta * db[c] + t;
	}
}

// The optimizers read the gradient through grad_at: g[i], or, when gp is
// not null, (g[i] + gp[i]) × gs: the peer's gradients in this GPU's memory,
// added and averaged as the optimizer reads them (worker.DataParallel's
// FusedSum), in the order and rounding of package pairreduce's sum kernel,
// so both ranks, and a fused and an unfused step, agree bitwise.
__device__ __forceinline__ float grad_at(const float *g, const float *gp, float gs, long long i) {
	return gp ? __fmul_rn(__fadd_rn(g[i], gp[i]), gs) : g[i];
}

// Plain SGD: p -= lr × g. When p16 is not null it receives the new p as
// bfloat16 (the weights of bfloat16 GEMMs).
extern "C" __global__ void sgd(float *p, const float *g, const float *gp, float gs, float lr, long long n,
			       unsigned short *p16) {
	GRID_STRIDE(i, n) {
		float v = p[i] - lr * grad_at(g, gp, gs, i);
		p[i] = v;
		if (p16) p16[i] = f32_bf16_bits(v);
	}
}

// SGD with momentum (PyTorch's form): v = mu × v + g; p -= lr × v.
extern "C" __global__ void sgd_momentum(float *p, const float *g, const float *gp, float gs, float *v, float lr,
					float mu, long long n, unsigned short *p16) {
	GRID_STRIDE(i, n) {
		float m = mu * v[i] + grad_at(g, gp, gs, i);
		v[i] = m;
		float w = p[i] - lr * m;
		p[i] = w;
		if (p16) p16[i] = f32_bf16_bits(w);
	}
}

// Adam: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g²;
// p -= lr × (m / c1) / (sqrt(v / c2) + eps), with c1 = 1-b1^t, c2 = 1-b2^t.
extern "C" __global__ void adam(float *p, const float *g, const float *gp, float gs, float *m, float *v, float lr,
				float b1, float b2, float eps, float c1, float c2, long long n, unsigned short *p16) {
	GRID_STRIDE(i, n) {
		float gi = grad_at(g, gp, gs, i);
		float mi = b1 * m[i] + (1.0f - b1) * gi;
		float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
		m[i] = mi;
		v[i] = vi;
		float w = p[i] - lr * (mi / c1) / (sqrtf(vi / c2) + eps);
		p[i] = w;
		if (p16) p16[i] = f32_bf16_bits(w);
	}
}

// dst = src rounded to bfloat16 (nearest, ties to even).
extern "C" __global__ void f32_to_bf16(unsigned short *dst, const float *src, long long n) {
	GRID_STRIDE(i, n) { dst[i] = f32_bf16_bits(src[i]); }
}

// dst = scale × src, bfloat16 to float32.
extern "C" __global__ void bf16_to_f32(float *dst, const unsigned short *src, long long n, float scale) {
	GRID_STRIDE(i, n) { dst[i] = scale * bf16_bits_f32(src[i]); }
}

// p *= s.
extern "C" __global__ void scale_f32(float *p, long long n, float s) {
	GRID_STRIDE(i, n) { p[i] *= s; }
}
