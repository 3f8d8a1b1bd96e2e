/* A stand-in for libcuda's driver API, for tests on hosts without a GPU: it checks how we call
 * the driver (a context current for every memory call, arguments marshalled as the real
 * signatures take them, register/unregister paired), never what a GPU would compute. Every call
 * is appended to a log the test reads with stand_in_log(). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define INVALID_CONTEXT 201
#define NOT_REGISTERED 713
#define ALREADY_REGISTERED 712

static char log_text[1 << 16];
static int depth;                 /* contexts pushed on the (one) calling thread */
static int ctx_token = 0x5eed;    /* what the primary context "is" */
static uint64_t alloc_base, alloc_size;
static int refuse_register;
static uintptr_t registered[64];

static void note(const char *line) {
    size_t used = strlen(log_text);
    snprintf(log_text + used, sizeof log_text - used, "%s\n", line);
}

const char *stand_in_log(void) { return log_text; }
void stand_in_reset(void) { log_text[0] = 0; depth = 0; refuse_register = 0;
                            memset(registered, 0, sizeof registered); }
void stand_in_allocation(uint64_t base, uint64_t size) { alloc_base = base; alloc_size = size; }
void stand_in_refuse_register(int status) { refuse_register = status; }

int cuInit(unsigned flags) { char b[64]; snprintf(b, 64, "cuInit %u", flags); note(b); return 0; }
int cuDeviceGet(int *device, int ordinal) {
    char b[64]; snprintf(b, 64, "cuDeviceGet %d", ordinal); note(b);
    *device = 100 + ordinal; return 0;
}
int cuDevicePrimaryCtxRetain(void **ctx, int device) {
    char b[64]; snprintf(b, 64, "cuDevicePrimaryCtxRetain %d", device); note(b);
    *ctx = &ctx_token; return 0;
}
int cuDevicePrimaryCtxRelease_v2(int device) {
    char b[64]; snprintf(b, 64, "cuDevicePrimaryCtxRelease %d", device); note(b); return 0;
}
int cuCtxPushCurrent_v2(void *ctx) {
    note(ctx == &ctx_token ? "cuCtxPushCurrent primary" : "cuCtxPushCurrent other");
    depth++; return 0;
}
int cuCtxPopCurrent_v2(void **ctx) {
    note("cuCtxPopCurrent"); if (depth) depth--; *ctx = &ctx_token; return 0;
}
int cuMemGetAddressRange_v2(uint64_t *base, size_t *size, uint64_t pointer) {
    char b[96]; snprintf(b, 96, "cuMemGetAddressRange %#llx", (unsigned long long)pointer);
    note(b);
    if (!depth) return INVALID_CONTEXT;
    if (pointer < alloc_base || pointer >= alloc_base + alloc_size) return 1;
    *base = alloc_base; *size = alloc_size; return 0;
}
int cuMemHostRegister_v2(void *p, size_t size, unsigned flags) {
    char b[96]; snprintf(b, 96, "cuMemHostRegister %#lx %zu %u", (unsigned long)(uintptr_t)p,
                         size, flags);
    note(b);
    if (!depth) return INVALID_CONTEXT;
    if (refuse_register) return refuse_register;
    for (int i = 0; i < 64; i++) if (registered[i] == (uintptr_t)p) return ALREADY_REGISTERED;
    for (int i = 0; i < 64; i++) if (!registered[i]) { registered[i] = (uintptr_t)p; break; }
    return 0;
}
int cuMemHostUnregister(void *p) {
    char b[96]; snprintf(b, 96, "cuMemHostUnregister %#lx", (unsigned long)(uintptr_t)p); note(b);
    if (!depth) return INVALID_CONTEXT;
    for (int i = 0; i < 64; i++)
        if (registered[i] == (uintptr_t)p) { registered[i] = 0; return 0; }
    return NOT_REGISTERED;
}
