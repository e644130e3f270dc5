// The router of `ferry pd`: starts the prefill and decode workers (pd_procs.h), introduces them
// to each other, lets requests arrive (pd_arrivals.h), allocates their blocks per instance
// (pd_alloc.h), drives each request through its prefill and decode instance in write or read
// mode, and ends with a summary (pd_summary.h).
//
// Every wait has a deadline: a worker that dies is seen at once (its channel closes), a request
// that does not end in time is aborted and counted as stuck, and a run that passes --timeout
// ends with whatever did not finish counted as stuck.
//
// Thread safety: one thread.
#pragma once

#include "pd_config.h"

namespace ferry::tools::pd {

// Runs the whole simulation; the exit status (0 ok, 1 a check failed).
int RunRouter(const PdConfig& config);

}  // namespace ferry::tools::pd
