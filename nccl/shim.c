// gotrain's NCCL shim: dlopen libnccl.so.2, resolve the entry points with
// dlsym, and call through them. Go makes exactly one cgo call per NCCL call.

//go:build cgo

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "shim.h"

typedef void *comm_t;   // ncclComm_t
typedef void *stream_t; // cudaStream_t

static struct {
	void *handle;
	// required
	int (*getVersion)(int *);
	int (*getUniqueId)(gtn_uid *);
	int (*commInitRank)(comm_t *, int, gtn_uid, int);
	int (*commDestroy)(comm_t);
	int (*commAbort)(comm_t);
	const char *(*getErrorString)(int);
	int (*commGetAsyncError)(comm_t, int *);
	int (*commCount)(comm_t, int *);
	int (*commCuDevice)(comm_t, int *);
	int (*commUserRank)(comm_t, int *);
	int (*allReduce)(const void *, void *, size_t, int, int, comm_t, stream_t);
	int (*broadcast)(const void *, void *, size_t, int, int, comm_t, stream_t);
	int (*reduce)(const void *, void *, size_t, int, int, int, comm_t, stream_t);
	int (*allGather)(const void *, void *, size_t, int, comm_t, stream_t);
	int (*reduceScatter)(const void *, void *, size_t, int, int, comm_t, stream_t);
	int (*send)(const void *, size_t, int, int, comm_t, stream_t);
	int (*recv)(void *, size_t, int, int, comm_t, stream_t);
	int (*groupStart)(void);
	int (*groupEnd)(void);
	// optional, in GTN_OPT_* order
	const char *(*getLastError)(comm_t);
	int (*commInitRankConfig)(comm_t *, int, gtn_uid, int, gtn_config *);
	int (*commFinalize)(comm_t);
	int (*commSplit)(comm_t, int, int, comm_t *, gtn_config *);
	int (*commInitRankScalable)(comm_t *, int, int, int, gtn_uid *, gtn_config *);
	int (*memAlloc)(void **, size_t);
	int (*memFree)(void *);
	int (*commWindowRegister)(comm_t, void *, size_t, void **, int);
	int (*commWindowDeregister)(comm_t, void *);
	int (*commShrink)(comm_t, int *, int, comm_t *, gtn_config *, int);
	int (*commRevoke)(comm_t, int);
	int (*commGetUniqueId)(comm_t, gtn_uid *);
	int (*commGrow)(comm_t, int, const gtn_uid *, int, comm_t *, gtn_config *);
} fn;

static const char *optional_names[GTN_OPT_COUNT] = {
	"ncclGetLastError",
	"ncclCommInitRankConfig",
	"ncclCommFinalize",
	"ncclCommSplit",
	"ncclCommInitRankScalable",
	"ncclMemAlloc",
	"ncclMemFree",
	"ncclCommWindowRegister",
	"ncclCommWindowDeregister",
	"ncclCommShrink",
	"ncclCommRevoke",
	"ncclCommGetUniqueId",
	"ncclCommGrow",
};

#define REQUIRE(field, name)                                                   \
	do {                                                                   \
		*(void **)(&fn.field) = dlsym(h, name);                        \
		if (fn.field == NULL) {                                        \
			snprintf(err, errlen, "%s has no symbol %s", path, name); \
			goto fail;                                             \
		}                                                              \
	} while (0)

#define OPTIONAL(field, name) (*(void **)(&fn.field) = dlsym(h, name))

int gtn_open(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e != NULL ? e : "dlopen failed");
		return -1;
	}
	if (fn.handle != NULL) {
		// One NCCL per process: opening the loaded one again is fine.
		dlclose(h);
		if (h == fn.handle) {
			return 0;
		}
		snprintf(err, errlen, "%s is another NCCL than the one already loaded", path);
		return -1;
	}
	REQUIRE(getVersion, "ncclGetVersion");
	REQUIRE(getUniqueId, "ncclGetUniqueId");
	REQUIRE(commInitRank, "ncclCommInitRank");
	REQUIRE(commDestroy, "ncclCommDestroy");
	REQUIRE(commAbort, "ncclCommAbort");
	REQUIRE(getErrorString, "ncclGetErrorString");
	REQUIRE(commGetAsyncError, "ncclCommGetAsyncError");
	REQUIRE(commCount, "ncclCommCount");
	REQUIRE(commCuDevice, "ncclCommCuDevice");
	REQUIRE(commUserRank, "ncclCommUserRank");
	REQUIRE(allReduce, "ncclAllReduce");
	REQUIRE(broadcast, "ncclBroadcast");
	REQUIRE(reduce, "ncclReduce");
	REQUIRE(allGather, "ncclAllGather");
	REQUIRE(reduceScatter, "ncclReduceScatter");
	REQUIRE(send, "ncclSend");
	REQUIRE(recv, "ncclRecv");
	REQUIRE(groupStart, "ncclGroupStart");
	REQUIRE(groupEnd, "ncclGroupEnd");
	OPTIONAL(getLastError, optional_names[GTN_OPT_GET_LAST_ERROR]);
	OPTIONAL(commInitRankConfig, optional_names[GTN_OPT_INIT_RANK_CONFIG]);
	OPTIONAL(commFinalize, optional_names[GTN_OPT_FINALIZE]);
	OPTIONAL(commSplit, optional_names[GTN_OPT_SPLIT]);
	OPTIONAL(commInitRankScalable, optional_names[GTN_OPT_INIT_RANK_SCALABLE]);
	OPTIONAL(memAlloc, optional_names[GTN_OPT_MEM_ALLOC]);
	OPTIONAL(memFree, optional_names[GTN_OPT_MEM_FREE]);
	OPTIONAL(commWindowRegister, optional_names[GTN_OPT_WINDOW_REGISTER]);
	OPTIONAL(commWindowDeregister, optional_names[GTN_OPT_WINDOW_DEREGISTER]);
	OPTIONAL(commShrink, optional_names[GTN_OPT_SHRINK]);
	OPTIONAL(commRevoke, optional_names[GTN_OPT_REVOKE]);
	OPTIONAL(commGetUniqueId, optional_names[GTN_OPT_COMM_GET_UNIQUE_ID]);
	OPTIONAL(commGrow, optional_names[GTN_OPT_GROW]);
	fn.handle = h;
	return 0;
fail:
	memset(&fn, 0, sizeof fn);
	dlclose(h);
	return -1;
}

void gtn_close(void) {
	if (fn.handle != NULL) {
		dlclose(fn.handle);
	}
	memset(&fn, 0, sizeof fn);
}

const char *gtn_optional_name(int i) {
	return i >= 0 && i < GTN_OPT_COUNT ? optional_names[i] : NULL;
}

int gtn_optional_present(int i) {
	switch (i) {
	case GTN_OPT_GET_LAST_ERROR: return fn.getLastError != NULL;
	case GTN_OPT_INIT_RANK_CONFIG: return fn.commInitRankConfig != NULL;
	case GTN_OPT_FINALIZE: return fn.commFinalize != NULL;
	case GTN_OPT_SPLIT: return fn.commSplit != NULL;
	case GTN_OPT_INIT_RANK_SCALABLE: return fn.commInitRankScalable != NULL;
	case GTN_OPT_MEM_ALLOC: return fn.memAlloc != NULL;
	case GTN_OPT_MEM_FREE: return fn.memFree != NULL;
	case GTN_OPT_WINDOW_REGISTER: return fn.commWindowRegister != NULL;
	case GTN_OPT_WINDOW_DEREGISTER: return fn.commWindowDeregister != NULL;
	case GTN_OPT_SHRINK: return fn.commShrink != NULL;
	case GTN_OPT_REVOKE: return fn.commRevoke != NULL;
	case GTN_OPT_COMM_GET_UNIQUE_ID: return fn.commGetUniqueId != NULL;
	case GTN_OPT_GROW: return fn.commGrow != NULL;
	}
	return 0;
}

int gtn_get_version(int *version) { return fn.getVersion(version); }

const char *gtn_error_string(int result) { return fn.getErrorString(result); }

const char *gtn_last_error(uintptr_t comm) {
	return fn.getLastError != NULL ? fn.getLastError((comm_t)comm) : NULL;
}

int gtn_get_unique_id(gtn_uid *id) { return fn.getUniqueId(id); }

// The init and split wrappers hand NCCL the caller's slot itself: with a
// non-blocking communicator NCCL may store the new handle into it after the
// call returns, so the slot lives in C memory that Go frees only later.

int gtn_comm_init_rank(uintptr_t *comm, int nranks, const gtn_uid *id, int rank) {
	return fn.commInitRank((comm_t *)comm, nranks, *id, rank);
}

int gtn_comm_init_rank_config(uintptr_t *comm, int nranks, const gtn_uid *id, int rank, gtn_config *cfg) {
	if (fn.commInitRankConfig == NULL) return GTN_MISSING;
	return fn.commInitRankConfig((comm_t *)comm, nranks, *id, rank, cfg);
}

int gtn_comm_init_rank_scalable(uintptr_t *comm, int nranks, int rank, int nids, gtn_uid *ids, gtn_config *cfg) {
	if (fn.commInitRankScalable == NULL) return GTN_MISSING;
	return fn.commInitRankScalable((comm_t *)comm, nranks, rank, nids, ids, cfg);
}

int gtn_comm_split(uintptr_t comm, int color, int key, uintptr_t *newcomm, gtn_config *cfg) {
	if (fn.commSplit == NULL) return GTN_MISSING;
	return fn.commSplit((comm_t)comm, color, key, (comm_t *)newcomm, cfg);
}

int gtn_comm_finalize(uintptr_t comm) {
	if (fn.commFinalize == NULL) return GTN_MISSING;
	return fn.commFinalize((comm_t)comm);
}

// ncclCommShrink sorts the exclude list in place; the caller's copy is C
// memory that lives for the call (NCCL keeps its own copy for the async job).
int gtn_comm_shrink(uintptr_t comm, int *exclude, int nexclude, uintptr_t *newcomm, gtn_config *cfg, int flags) {
	if (fn.commShrink == NULL) return GTN_MISSING;
	return fn.commShrink((comm_t)comm, exclude, nexclude, (comm_t *)newcomm, cfg, flags);
}

int gtn_comm_revoke(uintptr_t comm, int flags) {
	if (fn.commRevoke == NULL) return GTN_MISSING;
	return fn.commRevoke((comm_t)comm, flags);
}

int gtn_comm_get_unique_id(uintptr_t comm, gtn_uid *id) {
	if (fn.commGetUniqueId == NULL) return GTN_MISSING;
	return fn.commGetUniqueId((comm_t)comm, id);
}

// comm is 0 on a new rank; id is NULL on an existing rank other than the root.
int gtn_comm_grow(uintptr_t comm, int nranks, const gtn_uid *id, int rank, uintptr_t *newcomm, gtn_config *cfg) {
	if (fn.commGrow == NULL) return GTN_MISSING;
	return fn.commGrow((comm_t)comm, nranks, id, rank, (comm_t *)newcomm, cfg);
}

int gtn_comm_destroy(uintptr_t comm) { return fn.commDestroy((comm_t)comm); }
int gtn_comm_abort(uintptr_t comm) { return fn.commAbort((comm_t)comm); }
int gtn_comm_get_async_error(uintptr_t comm, int *state) { return fn.commGetAsyncError((comm_t)comm, state); }
int gtn_comm_count(uintptr_t comm, int *n) { return fn.commCount((comm_t)comm, n); }
int gtn_comm_cu_device(uintptr_t comm, int *dev) { return fn.commCuDevice((comm_t)comm, dev); }
int gtn_comm_user_rank(uintptr_t comm, int *rank) { return fn.commUserRank((comm_t)comm, rank); }

int gtn_mem_alloc(uintptr_t *ptr, size_t size) {
	if (fn.memAlloc == NULL) return GTN_MISSING;
	return fn.memAlloc((void **)ptr, size);
}

int gtn_mem_free(uintptr_t ptr) {
	if (fn.memFree == NULL) return GTN_MISSING;
	return fn.memFree((void *)ptr);
}

int gtn_comm_window_register(uintptr_t comm, uintptr_t buf, size_t size, uintptr_t *win, int flags) {
	if (fn.commWindowRegister == NULL) return GTN_MISSING;
	return fn.commWindowRegister((comm_t)comm, (void *)buf, size, (void **)win, flags);
}

int gtn_comm_window_deregister(uintptr_t comm, uintptr_t win) {
	if (fn.commWindowDeregister == NULL) return GTN_MISSING;
	return fn.commWindowDeregister((comm_t)comm, (void *)win);
}

int gtn_all_reduce(uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, uintptr_t comm, uintptr_t stream) {
	return fn.allReduce((const void *)send, (void *)recv, count, dtype, op, (comm_t)comm, (stream_t)stream);
}

int gtn_broadcast(uintptr_t send, uintptr_t recv, size_t count, int dtype, int root, uintptr_t comm, uintptr_t stream) {
	return fn.broadcast((const void *)send, (void *)recv, count, dtype, root, (comm_t)comm, (stream_t)stream);
}

int gtn_reduce(uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root, uintptr_t comm, uintptr_t stream) {
	return fn.reduce((const void *)send, (void *)recv, count, dtype, op, root, (comm_t)comm, (stream_t)stream);
}

int gtn_all_gather(uintptr_t send, uintptr_t recv, size_t sendcount, int dtype, uintptr_t comm, uintptr_t stream) {
	return fn.allGather((const void *)send, (void *)recv, sendcount, dtype, (comm_t)comm, (stream_t)stream);
}

int gtn_reduce_scatter(uintptr_t send, uintptr_t recv, size_t recvcount, int dtype, int op, uintptr_t comm, uintptr_t stream) {
	return fn.reduceScatter((const void *)send, (void *)recv, recvcount, dtype, op, (comm_t)comm, (stream_t)stream);
}

int gtn_send(uintptr_t buf, size_t count, int dtype, int peer, uintptr_t comm, uintptr_t stream) {
	return fn.send((const void *)buf, count, dtype, peer, (comm_t)comm, (stream_t)stream);
}

int gtn_recv(uintptr_t buf, size_t count, int dtype, int peer, uintptr_t comm, uintptr_t stream) {
	return fn.recv((void *)buf, count, dtype, peer, (comm_t)comm, (stream_t)stream);
}

int gtn_group_start(void) { return fn.groupStart(); }
int gtn_group_end(void) { return fn.groupEnd(); }
