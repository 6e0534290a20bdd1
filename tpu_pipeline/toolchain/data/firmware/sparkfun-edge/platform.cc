// SparkFun Edge (Ambiq Apollo3 Blue) implementation of harness_platform.h, on the AmbiqSuite SDK.
// Ticks: the DWT cycle counter, one per core cycle at 48 MHz, which is the HARNESS_TICKS_PER_S
// that export-mcu writes from devices/sparkfun-edge.toml (it wraps after ~89 s: fine per invoke).

#include "am_bsp.h"
#include "am_mcu_apollo.h"
#include "am_util.h"
#include "harness_platform.h"

static void* g_uart;

void harness_platform_init(uint32_t baud) {
  am_hal_clkgen_control(AM_HAL_CLKGEN_CONTROL_SYSCLK_MAX, 0);
  am_hal_cachectrl_config(&am_hal_cachectrl_defaults);
  am_hal_cachectrl_enable();
  am_bsp_low_power_init();
  am_hal_uart_config_t cfg = {};
  cfg.ui32BaudRate = baud;
  cfg.ui32DataBits = AM_HAL_UART_DATA_BITS_8;
  cfg.ui32Parity = AM_HAL_UART_PARITY_NONE;
  cfg.ui32StopBits = AM_HAL_UART_ONE_STOP_BIT;
  cfg.ui32FlowControl = AM_HAL_UART_FLOW_CTRL_NONE;
  cfg.ui32FifoLevels = AM_HAL_UART_TX_FIFO_1_2 | AM_HAL_UART_RX_FIFO_1_2;
  am_hal_uart_initialize(0, &g_uart);
  am_hal_uart_power_control(g_uart, AM_HAL_SYSCTRL_WAKE, false);
  am_hal_uart_configure(g_uart, &cfg);
  am_hal_gpio_pinconfig(AM_BSP_GPIO_COM_UART_TX, g_AM_BSP_GPIO_COM_UART_TX);
  am_hal_gpio_pinconfig(AM_BSP_GPIO_COM_UART_RX, g_AM_BSP_GPIO_COM_UART_RX);
  // DWT cycle counter: one tick per core cycle (48 MHz).
  CoreDebug->DEMCR |= CoreDebug_DEMCR_TRCENA_Msk;
  DWT->CYCCNT = 0;
  DWT->CTRL |= DWT_CTRL_CYCCNTENA_Msk;
}

int harness_platform_getc() {
  uint8_t c;
  uint32_t n = 0;
  am_hal_uart_transfer_t rx = {};
  rx.ui32Direction = AM_HAL_UART_READ;
  rx.pui8Data = &c;
  rx.ui32NumBytes = 1;
  rx.ui32TimeoutMs = 0;
  rx.pui32BytesTransferred = &n;
  am_hal_uart_transfer(g_uart, &rx);
  return n ? c : -1;
}

void harness_platform_write(const char* data, size_t len) {
  uint32_t n = 0;
  am_hal_uart_transfer_t tx = {};
  tx.ui32Direction = AM_HAL_UART_WRITE;
  tx.pui8Data = reinterpret_cast<uint8_t*>(const_cast<char*>(data));
  tx.ui32NumBytes = len;
  tx.ui32TimeoutMs = AM_HAL_UART_WAIT_FOREVER;
  tx.pui32BytesTransferred = &n;
  am_hal_uart_transfer(g_uart, &tx);
}

uint32_t harness_platform_ticks() { return DWT->CYCCNT; }

void harness_platform_reset() { NVIC_SystemReset(); }
