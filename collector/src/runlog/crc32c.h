// CRC32C (Castagnoli, the iSCSI / ext4 / leveldb checksum) of the run log's records.
//
// Crc32c() picks, once per process, the SSE4.2 `crc32` instruction when the CPU has it
// and a slicing-by-8 table otherwise; both are exposed so tests can check they agree
// and the bench can measure each. Pure functions, callable from any thread.
#ifndef LOCKSTEP_COLLECTOR_RUNLOG_CRC32C_H_
#define LOCKSTEP_COLLECTOR_RUNLOG_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace lockstep::collector::crc32c {

// Continues a CRC: Extend(Extend(0, a), b) == Value(a ++ b). `crc` is a previous
// result (0 to start).
uint32_t Extend(uint32_t crc, const void* data, size_t n);
inline uint32_t Value(const void* data, size_t n) { return Extend(0, data, n); }

// The two implementations behind Extend(). ExtendHardware must only be called when
// HardwareAvailable() is true.
uint32_t ExtendSoftware(uint32_t crc, const void* data, size_t n);
uint32_t ExtendHardware(uint32_t crc, const void* data, size_t n);
bool HardwareAvailable();

}  // namespace lockstep::collector::crc32c

#endif  // LOCKSTEP_COLLECTOR_RUNLOG_CRC32C_H_
