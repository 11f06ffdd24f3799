// Declarations for gotrain's NCCL shim. These are gotrain's own declarations of
// the parts of NCCL's C ABI it uses; no NCCL header is needed to build. Every
// NCCL call goes through a function pointer that gtn_open resolves with dlsym.

#ifndef GOTRAIN_NCCL_SHIM_H
#define GOTRAIN_NCCL_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

// ncclUniqueId: 128 opaque bytes, passed by value to the init functions.
typedef struct {
	char internal[128];
} gtn_uid;

// ncclConfig_t as laid out by NCCL 2.28 (fields up to nvlinkCentricSched).
// NCCL copies min(size, its own sizeof) bytes and resets the fields newer
// than version to its defaults, so both older and newer libraries accept it.
typedef struct {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
	int trafficClass;
	const char *commName;
	int collnetEnable;
	int CTAPolicy;
	int shrinkShare;
	int nvlsCTAs;
	int nChannelsPerNetPeer;
	int nvlinkCentricSched;
} gtn_config;

#define GTN_CONFIG_MAGIC 0xcafebeefu
#define GTN_CONFIG_VERSION 22800 /* NCCL_VERSION(2,28,0): the layout above */
#define GTN_MISSING (-1)          /* returned when an optional symbol is absent */

// Optional symbols, in the order gtn_optional_name reports them.
enum {
	GTN_OPT_GET_LAST_ERROR,
	GTN_OPT_INIT_RANK_CONFIG,
	GTN_OPT_FINALIZE,
	GTN_OPT_SPLIT,
	GTN_OPT_INIT_RANK_SCALABLE,
	GTN_OPT_MEM_ALLOC,
	GTN_OPT_MEM_FREE,
	GTN_OPT_WINDOW_REGISTER,
	GTN_OPT_WINDOW_DEREGISTER,
	GTN_OPT_SHRINK,
	GTN_OPT_REVOKE,
	GTN_OPT_COMM_GET_UNIQUE_ID,
	GTN_OPT_GROW,
	GTN_OPT_COUNT
};

int gtn_open(const char *path, char *err, size_t errlen);
void gtn_close(void);
const char *gtn_optional_name(int i);
int gtn_optional_present(int i);

int gtn_get_version(int *version);
const char *gtn_error_string(int result);
const char *gtn_last_error(uintptr_t comm);
int gtn_get_unique_id(gtn_uid *id);

int gtn_comm_init_rank(uintptr_t *comm, int nranks, const gtn_uid *id, int rank);
int gtn_comm_init_rank_config(uintptr_t *comm, int nranks, const gtn_uid *id, int rank, gtn_config *cfg);
int gtn_comm_init_rank_scalable(uintptr_t *comm, int nranks, int rank, int nids, gtn_uid *ids, gtn_config *cfg);
int gtn_comm_split(uintptr_t comm, int color, int key, uintptr_t *newcomm, gtn_config *cfg);
int gtn_comm_finalize(uintptr_t comm);

// NCCL 2.27: shrink; 2.29: revoke, grow and the per-communicator id grow takes.
int gtn_comm_shrink(uintptr_t comm, int *exclude, int nexclude, uintptr_t *newcomm, gtn_config *cfg, int flags);
int gtn_comm_revoke(uintptr_t comm, int flags);
int gtn_comm_get_unique_id(uintptr_t comm, gtn_uid *id);
int gtn_comm_grow(uintptr_t comm, int nranks, const gtn_uid *id, int rank, uintptr_t *newcomm, gtn_config *cfg);
int gtn_comm_destroy(uintptr_t comm);
int gtn_comm_abort(uintptr_t comm);
int gtn_comm_get_async_error(uintptr_t comm, int *state);
int gtn_comm_count(uintptr_t comm, int *n);
int gtn_comm_cu_device(uintptr_t comm, int *dev);
int gtn_comm_user_rank(uintptr_t comm, int *rank);

// NCCL 2.27: memory for symmetric windows, and window registration.
int gtn_mem_alloc(uintptr_t *ptr, size_t size);
int gtn_mem_free(uintptr_t ptr);
int gtn_comm_window_register(uintptr_t comm, uintptr_t buf, size_t size, uintptr_t *win, int flags);
int gtn_comm_window_deregister(uintptr_t comm, uintptr_t win);

int gtn_all_reduce(uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, uintptr_t comm, uintptr_t stream);
int gtn_broadcast(uintptr_t send, uintptr_t recv, size_t count, int dtype, int root, uintptr_t comm, uintptr_t stream);
int gtn_reduce(uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root, uintptr_t comm, uintptr_t stream);
int gtn_all_gather(uintptr_t send, uintptr_t recv, size_t sendcount, int dtype, uintptr_t comm, uintptr_t stream);
int gtn_reduce_scatter(uintptr_t send, uintptr_t recv, size_t recvcount, int dtype, int op, uintptr_t comm, uintptr_t stream);
int gtn_send(uintptr_t buf, size_t count, int dtype, int peer, uintptr_t comm, uintptr_t stream);
int gtn_recv(uintptr_t buf, size_t count, int dtype, int peer, uintptr_t comm, uintptr_t stream);
int gtn_group_start(void);
int gtn_group_end(void);

#endif
