// Nordic nRF52840 UARTE (UART with EasyDMA; nRF52840 Product Specification v1.7, section 6.34):
// TASKS_STARTRX 0x000, TASKS_STARTTX 0x008, EVENTS_ENDRX 0x110, EVENTS_ENDTX 0x120,
// ENABLE 0x500 (8 = UARTE), PSEL.TXD 0x50C, PSEL.RXD 0x514 (port << 5 | pin), BAUDRATE 0x524,
// RXD.PTR 0x534, RXD.MAXCNT 0x538, TXD.PTR 0x544, TXD.MAXCNT 0x548, CONFIG 0x56C.
// EasyDMA reads and writes RAM only, so bytes go through RAM buffers. Polled, no interrupt.
// NOT HARDWARE-TESTED: it builds and links against the board's memory map.
#include <stdint.h>

#include "board_config.h"

namespace {
inline volatile uint32_t& uarte(uint32_t off) { return *reinterpret_cast<volatile uint32_t*>(BOARD_UART_BASE + off); }
constexpr uint32_t kStartRx = 0x000, kStartTx = 0x008, kEndRx = 0x110, kEndTx = 0x120, kEnable = 0x500,
                   kPselTxd = 0x50C, kPselRxd = 0x514, kBaud = 0x524, kRxPtr = 0x534, kRxMax = 0x538,
                   kTxPtr = 0x544, kTxMax = 0x548, kConfig = 0x56C;
volatile uint8_t g_rx;
uint8_t g_tx;

uint32_t baud_register(uint32_t baud) {
  // The product specification's table of BAUDRATE values.
  switch (baud) {
    case 9600: return 0x00275000u;
    case 38400: return 0x009D5000u;
    case 57600: return 0x00EB0000u;
    case 230400: return 0x03AFB000u;
    case 460800: return 0x075F7000u;
    case 921600: return 0x0EBED000u;
    case 1000000: return 0x10000000u;
    default: return 0x01D7E000u;  // 115200
  }
}

void start_rx() {
  uarte(kEndRx) = 0;
  uarte(kRxPtr) = reinterpret_cast<uint32_t>(&g_rx);
  uarte(kRxMax) = 1;
  uarte(kStartRx) = 1;
}
}  // namespace

void board_clock_init() {}  // the nRF52840 runs at 64 MHz from reset (HFINT)

void board_uart_init(uint32_t baud) {
  uarte(kEnable) = 0;
  uarte(kPselTxd) = BOARD_UART_TX_PIN;
  uarte(kPselRxd) = BOARD_UART_RX_PIN;
  uarte(kBaud) = baud_register(baud);
  uarte(kConfig) = 0;  // 8N1, no flow control
  uarte(kEnable) = 8;
  start_rx();
}

int board_uart_getc() {
  if (!uarte(kEndRx)) return -1;
  int c = g_rx;
  start_rx();
  return c;
}

void board_uart_putc(char c) {
  g_tx = static_cast<uint8_t>(c);
  uarte(kEndTx) = 0;
  uarte(kTxPtr) = reinterpret_cast<uint32_t>(&g_tx);
  uarte(kTxMax) = 1;
  uarte(kStartTx) = 1;
  while (!uarte(kEndTx)) {
  }
}
