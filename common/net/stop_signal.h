// SIGINT/SIGTERM handling for the services and the launcher: the first signal asks the process to
// stop (the callback must only store to an atomic); a second one exits at once.
#pragma once

#include <atomic>

namespace litellama::net {

// Sets *flag to true on SIGINT or SIGTERM. The flag must outlive the process's signal handling
// (until detach_stop_signal()).
void install_stop_signal(std::atomic<bool>* flag);
// Forgets the flag, before it goes: a signal from now on ends the process at once (_exit(130)),
// as a second one would have.
void detach_stop_signal();

}  // namespace litellama::net
