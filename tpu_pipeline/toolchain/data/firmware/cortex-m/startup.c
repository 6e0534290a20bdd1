// Cortex-M startup for the harness firmware: vector table, reset (FPU on, .data copied from flash,
// .bss zeroed, C++ constructors), fault handlers. No vendor files needed: every address here is
// in the Armv7-M architecture reference manual (System Control Space at 0xE000E000).
#include <stdint.h>

extern uint32_t __data_load[], __data_start[], __data_end[], __bss_start__[], __bss_end__[], __stack_top[];
extern uint32_t __stack_limit[];
extern int main(void);
extern void __libc_init_array(void);
void harness_platform_fault(const char* what);

void Reset_Handler(void);
static void Default_Handler(void) {
  for (;;) {
  }
}
static void HardFault_Handler(void) { harness_platform_fault("HardFault"); }
static void MemManage_Handler(void) { harness_platform_fault("MemManage"); }
static void BusFault_Handler(void) { harness_platform_fault("BusFault"); }
static void UsageFault_Handler(void) { harness_platform_fault("UsageFault"); }

// Handlers a board layer may define (the UART receive interrupt, the tick timer).
void SysTick_Handler(void) __attribute__((weak, alias("Default_Handler")));
void IRQ0_Handler(void) __attribute__((weak, alias("Default_Handler")));
void IRQ1_Handler(void) __attribute__((weak, alias("Default_Handler")));
void IRQ2_Handler(void) __attribute__((weak, alias("Default_Handler")));
void IRQ3_Handler(void) __attribute__((weak, alias("Default_Handler")));

typedef void (*vector_t)(void);
#define HARNESS_NUM_IRQS 32
__attribute__((used, section(".isr_vector"))) const vector_t g_vectors[16 + HARNESS_NUM_IRQS] = {
    (vector_t)__stack_top, Reset_Handler, Default_Handler /* NMI */, HardFault_Handler,
    MemManage_Handler, BusFault_Handler, UsageFault_Handler, 0, 0, 0, 0,
    Default_Handler /* SVC */, Default_Handler /* DebugMon */, 0, Default_Handler /* PendSV */,
    SysTick_Handler, IRQ0_Handler, IRQ1_Handler, IRQ2_Handler, IRQ3_Handler,
    [20 ... 16 + HARNESS_NUM_IRQS - 1] = Default_Handler};

// The stack's high-water mark: at reset every word from the reserve's bottom up to just below the
// reset handler's frame is painted; the stack grows down, so the lowest word no longer painted is
// the deepest the stack has been since (a call that leaves a painted word where it wrote the same
// value can only make the figure smaller by that word's depth: it is a measure, not a guarantee).
#define STACK_PAINT 0x5354414Bu

static void __attribute__((noinline)) paint_stack(void) {
  uint32_t* sp;
  __asm volatile("mov %0, sp" : "=r"(sp));
  for (uint32_t* p = __stack_limit; p < sp - 16; ++p) *p = STACK_PAINT;  // (64 B under this frame)
}

// Bytes of stack used at the deepest since reset: from the top of RAM down to the lowest word
// written. All of the reserve when its bottom word is written: the stack may have gone past it.
uint32_t harness_stack_used(void) {
  const uint32_t* p = __stack_limit;
  while (p < __stack_top && *p == STACK_PAINT) ++p;
  return (uint32_t)((uintptr_t)__stack_top - (uintptr_t)p);
}

void Reset_Handler(void) {
#if defined(__ARM_FP)
  // CPACR: full access to CP10/CP11 before any floating-point instruction runs.
  *(volatile uint32_t*)0xE000ED88 |= 0xFu << 20;
  __asm volatile("dsb\n isb" ::: "memory");
#endif
  // VTOR: our table, wherever the image was linked (a bootloader may have left its own).
  *(volatile uint32_t*)0xE000ED08 = (uint32_t)g_vectors;
  for (uint32_t *src = __data_load, *dst = __data_start; dst < __data_end;) *dst++ = *src++;
  for (uint32_t* dst = __bss_start__; dst < __bss_end__;) *dst++ = 0;
  paint_stack();
  __libc_init_array();
  main();
  for (;;) {
  }
}
