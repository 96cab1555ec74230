/* autocast.c - the dtype matmul-like ops compute in (plugin.h,
 * pl_autocast_set / pl_autocast_get), read by pl_matmul, pl_linear and
 * pl_nf4_matmul. Tensor + ops layer. */
#include "internal.h"

static pl_dtype g_autocast = PL_F32;

void pl_autocast_set(pl_dtype dt) { g_autocast = dt; }
pl_dtype pl_autocast_get(void) { return g_autocast; }
