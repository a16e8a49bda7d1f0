#include "serve/http.h"
#include <csignal>
#include <cstdio>
#include <thread>
#include <pthread.h>
#include <httplib.h>
#include "core/check.h"

namespace lrnn::serve {

using nlohmann::json;

namespace {

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

json parse_body(const httplib::Request& req) {
  json j = json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw RequestError(400, "the request body is not valid JSON");
  return j;
}

// Runs one endpoint: its answer, or the error body a client can read.
template <class F>
void answer(httplib::Response& res, F&& f) {
  try {
    reply(res, 200, f());
  } catch (const RequestError& e) {
    reply(res, e.status, error_body(e.what(), e.status, e.param));
  } catch (const UserError& e) {  // e.g. a text SentencePiece refuses
    reply(res, 400, error_body(e.what(), 400));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lrnn serve: internal error: %s\n", e.what());
    reply(res, 500, error_body(std::string("internal error: ") + e.what(), 500));
  }
}

}  // namespace

int run_http(CompletionService& svc, const std::string& host, int port, const std::function<void(int)>& on_listen) {
  // SIGINT and SIGTERM go to one thread that stops the server (a signal handler may not): block
  // them here, before the server starts its threads, which inherit the mask.
  sigset_t stop_signals, old;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &old);

  httplib::Server svr;
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a second server on the
  // same port would bind too and share the requests instead of being told the port is taken.
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr.set_payload_max_length(size_t(256) << 20);
  svr.set_write_timeout(600);
  svr.Post("/v1/completions", [&](const httplib::Request& q, httplib::Response& r) {
    answer(r, [&] { return svc.completions(parse_body(q)); });
  });
  svr.Get("/v1/models", [&](const httplib::Request&, httplib::Response& r) { answer(r, [&] { return svc.models(); }); });
  svr.Get("/tokenizer_info", [&](const httplib::Request&, httplib::Response& r) {
    answer(r, [&] { return svc.tokenizer_info(); });
  });
  svr.Post("/tokenize", [&](const httplib::Request& q, httplib::Response& r) {
    answer(r, [&] { return svc.tokenize(parse_body(q)); });
  });
  svr.Post("/detokenize", [&](const httplib::Request& q, httplib::Response& r) {
    answer(r, [&] { return svc.detokenize(parse_body(q)); });
  });
  svr.Get("/health", [](const httplib::Request&, httplib::Response& r) { r.status = 200; });
  svr.set_error_handler([](const httplib::Request& q, httplib::Response& r) {
    if (!r.body.empty()) return;  // an endpoint's own error body
    const int status = r.status == 404 ? 404 : r.status;
    reply(r, status, error_body(status == 404 ? fmt::format("no endpoint {} {}", q.method, q.path)
                                              : fmt::format("HTTP {}", status), status));
  });

  const int bound = port == 0 ? svr.bind_to_any_port(host) : (svr.bind_to_port(host, port) ? port : -1);
  if (bound <= 0) {
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    LRNN_USER_ERROR("serve: cannot listen on {}:{} (in use, or not an address of this machine?); pick another "
                    "with --host / --port", host, port);
  }
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    svr.stop();
  });
  on_listen(bound);
  svr.listen_after_bind();
  svr.stop();
  // Wake the stopper if the server ended by itself.
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return 0;
}

}  // namespace lrnn::serve
