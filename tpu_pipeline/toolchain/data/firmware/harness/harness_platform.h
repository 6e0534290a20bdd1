// What a board must provide to the harness (see ../sparkfun-edge/platform.cc).
#pragma once

#include <cstddef>
#include <cstdint>

void harness_platform_init(uint32_t baud);      // clocks, UART at `baud`, tick timer
int harness_platform_getc();                    // next received byte, or -1 if none yet
void harness_platform_write(const char* data, size_t n);
uint32_t harness_platform_ticks();              // free-running counter at HARNESS_TICKS_PER_S
void harness_platform_tick_sync();              // optional (weak default: nothing): restart a coarse
                                                // tick counter so its phase is the same every RUN
void harness_platform_reset();                  // reboot (the firmware then prints BOOT and READY)
// Bytes of stack at the deepest since reset (cortex-m/startup.c paints the reserve at reset).
extern "C" uint32_t harness_stack_used(void);
