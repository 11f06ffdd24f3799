// The one kernel of package nodereduce: rank `me` owns a chunk of a bucket;
// once every other rank's copy of that chunk is in this GPU's inbox (slot j
// of rank j, copied there by rank j's copy engine), it writes
// g = (v_0 + v_1 + ... + v_{n-1}) * scale, adding in rank order, with
// its own value v_me read from g. The owner's result is then copied to the
// other ranks, so every rank ends with the same bits. node.ptx is written
// to match (`make ptx` regenerates it with nvcc).

extern "C" __global__ void node_sum(float *g, const float *inbox, long long stride, int nranks, int me,
				    long long n, float scale) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	long long step = (long long)gridDim.x * blockDim.x;
	for (; i < n; i += step) {
		float own = g[i];
		float acc = me == 0 ? own : __ldcs(inbox + i);
		for (int j = 1; j < nranks; j++) {
			float v = j == me ? own : __ldcs(inbox + j * stride + i);
			acc = __fadd_rn(acc, v);
		}
		g[i] = __fmul_rn(acc, scale);
	}
}
