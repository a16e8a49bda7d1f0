// `lrnn serve`: the completions service (serve/completions.h) over HTTP, with cpp-httplib
// (Debian's libcpp-httplib). Runs until SIGINT or SIGTERM.
#pragma once
#include <functional>
#include <string>
#include "serve/completions.h"

namespace lrnn::serve {

// Listens on host:port (port 0: a free port the system picks), calls on_listen with the port
// once the socket is bound, serves until SIGINT/SIGTERM (then finishes the requests in flight)
// and returns 0. UserError when the address cannot be bound.
int run_http(CompletionService& svc, const std::string& host, int port, const std::function<void(int)>& on_listen);

}  // namespace lrnn::serve
