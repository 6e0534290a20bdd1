// Stands in for TinyEngine's profile.h (which needs the STM32 HAL) when its code generator runs
// in profile mode: each layer's start/end ticks come from the harness's tick counter and are
// reported through te_layer (te_main.cc) instead of sprintf + a HAL UART.
#include <stdint.h>
uint32_t te_ticks(void);
void te_layer(const char* what, uint32_t ticks);
#define RUNS 1
static int profile_i;
static uint32_t start, end;
static char buf[1] __attribute__((unused));
#define HAL_GetTick() te_ticks()
#define sprintf(b, fmt, v) te_layer(fmt, end - start)
#define printLog(b) ((void)0)
