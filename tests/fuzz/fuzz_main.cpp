// fuzz_cortado: a deterministic mutation fuzzer for the targets of fuzz_targets.cpp, built
// with the project's compiler (no libFuzzer needed). It runs every file of the seed corpus,
// then --runs inputs made from them by seeded random mutations (bit flips, byte and integer
// overwrites, insertions, deletions, duplications, truncation, splices, dictionary tokens).
// Same seed, same inputs: a finding is reproducible from the command line it printed.
//
//   fuzz_cortado TARGET --corpus DIR [--corpus DIR]... [--runs N] [--seed S] [--max-len B]
//                [--crash-dir DIR]
//   fuzz_cortado TARGET FILE...      replays files (a saved finding, a regression input)
//   fuzz_cortado TARGET --write-seeds DIR   writes the seeds code makes (GeneratedSeeds)
//   fuzz_cortado --list
//
// A finding (an exception that is not cortado::Error, or a crash signal) saves the input to
// crash-dir/crash-TARGET-HASH.bin, prints one line naming it and exits non-zero. Built with
// -DCORTADO_SANITIZE=address,undefined, sanitizer reports are findings too.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/base/error.h"
#include "tests/fuzz/fuzz_targets.h"

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

// What the signal handler saves: the input being run.
const uint8_t* g_input = nullptr;
size_t g_input_size = 0;
char g_crash_path[4096];

uint64_t Fnv(const Bytes& b) {
  uint64_t h = 1469598103934665603ull;
  for (uint8_t c : b) h = (h ^ c) * 1099511628211ull;
  return h;
}

void SetCrashPath(const std::string& dir, const char* target, const Bytes& input) {
  char name[128];
  std::snprintf(name, sizeof(name), "crash-%s-%016llx.bin", target,
                static_cast<unsigned long long>(Fnv(input)));
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s/%s", dir.c_str(), name);
}

void SaveInput() {
  const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < g_input_size) {
    const ssize_t n = ::write(fd, g_input + done, g_input_size - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
}

void OnCrash(int sig) {
  SaveInput();
  const char head[] = "fuzz_cortado: crash signal; input saved to ";
  (void)!::write(2, head, sizeof(head) - 1);
  (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
  (void)!::write(2, "\n", 1);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

Bytes ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string s = ss.str();
  return Bytes(s.begin(), s.end());
}

// Tokens that mean something to one of the parsers (YAML syntax and keys, numbers at the
// edges of their types, JPEG markers, IDX magics and a big-endian 2^30).
const std::vector<std::string>& Dictionary() {
  static const std::vector<std::string> words = {":",
                                                 "\n",
                                                 "- ",
                                                 "{",
                                                 "}",
                                                 "[",
                                                 "]",
                                                 ",",
                                                 "'",
                                                 "\"",
                                                 "&a ",
                                                 "*a",
                                                 "!!binary ",
                                                 "~",
                                                 "#",
                                                 "model",
                                                 "layers",
                                                 "type",
                                                 "solver",
                                                 "data",
                                                 "distributed",
                                                 "checkpoint",
                                                 "precision",
                                                 "builder",
                                                 "codec",
                                                 "inputs",
                                                 "outputs",
                                                 "num_output",
                                                 "kernel",
                                                 "stride",
                                                 "batch_size",
                                                 "1e309",
                                                 "-1",
                                                 "0",
                                                 "nan",
                                                 ".inf",
                                                 "9223372036854775808",
                                                 "4294967296",
                                                 "-0",
                                                 "\xff\xd8\xff\xe0",
                                                 "\xff\xc0",
                                                 "\xff\xc4",
                                                 "\xff\xda",
                                                 "\xff\xd9",
                                                 "\xff\xdb",
                                                 std::string("\0\0\x08\x03", 4),
                                                 std::string("\0\0\x08\x01", 4),
                                                 std::string("\x40\0\0\0", 4)};
  return words;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  Bytes Mutate(const std::vector<Bytes>& corpus, size_t max_len) {
    Bytes b = corpus[Below(corpus.size())];
    const int steps = 1 + static_cast<int>(Below(4));
    for (int s = 0; s < steps; ++s) Step(b, corpus);
    if (b.size() > max_len) b.resize(max_len);
    return b;
  }

 private:
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  void Step(Bytes& b, const std::vector<Bytes>& corpus) {
    static const uint64_t kInteresting[] = {0,          1,      0x7f,       0x80,       0xff,
                                            0x7fff,     0x8000, 0xffff,     0x7fffffff, 0x80000000,
                                            0xffffffff, ~0ull,  1ull << 40, 1ull << 63};
    switch (Below(9)) {
      case 0:  // flip a bit
        if (!b.empty()) b[Below(b.size())] ^= static_cast<uint8_t>(1u << Below(8));
        break;
      case 1:  // a random or interesting byte
        if (!b.empty())
          b[Below(b.size())] = static_cast<uint8_t>(Below(2) ? rng_() : kInteresting[Below(5)]);
        break;
      case 2: {  // an interesting 1-, 2-, 4- or 8-byte integer
        const size_t width = size_t{1} << Below(4);
        if (b.size() < width) break;
        const uint64_t v = kInteresting[Below(std::size(kInteresting))];
        std::memcpy(b.data() + Below(b.size() - width + 1), &v, width);
        break;
      }
      case 3: {  // insert random bytes
        Bytes extra(1 + Below(8));
        for (auto& c : extra) c = static_cast<uint8_t>(rng_());
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(Below(b.size() + 1)), extra.begin(),
                 extra.end());
        break;
      }
      case 4: {  // delete a range
        if (b.empty()) break;
        const size_t at = Below(b.size());
        const size_t n = std::min(b.size() - at, 1 + Below(16));
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(at),
                b.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 5: {  // duplicate a range somewhere else
        if (b.empty()) break;
        const size_t at = Below(b.size());
        const size_t n = std::min(b.size() - at, 1 + Below(64));
        Bytes piece(b.begin() + static_cast<std::ptrdiff_t>(at),
                    b.begin() + static_cast<std::ptrdiff_t>(at + n));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(Below(b.size() + 1)), piece.begin(),
                 piece.end());
        break;
      }
      case 6:  // truncate
        b.resize(Below(b.size() + 1));
        break;
      case 7: {  // splice: this input's head, another's tail
        const Bytes& other = corpus[Below(corpus.size())];
        const size_t head = Below(b.size() + 1), tail = Below(other.size() + 1);
        b.resize(head);
        b.insert(b.end(), other.begin() + static_cast<std::ptrdiff_t>(tail), other.end());
        break;
      }
      default: {  // a dictionary token
        const std::string& w = Dictionary()[Below(Dictionary().size())];
        const size_t at = Below(b.size() + 1);
        if (Below(2) && at + w.size() <= b.size()) {
          std::memcpy(b.data() + at, w.data(), w.size());
        } else {
          b.insert(b.begin() + static_cast<std::ptrdiff_t>(at), w.begin(), w.end());
        }
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

// Runs one input; false (after saving it and saying why) for a finding.
bool RunOne(const cortado::fuzz::Target& target, const Bytes& input, const std::string& crash_dir,
            const std::string& origin) {
  SetCrashPath(crash_dir, target.name, input);
  g_input = input.data();
  g_input_size = input.size();
  const char* problem = nullptr;
  std::string what;
  try {
    target.run(input.data(), input.size());
  } catch (const std::exception& e) {
    problem = "an exception that is not cortado::Error";
    what = e.what();
  } catch (...) {
    problem = "a non-standard exception";
  }
  if (problem == nullptr) return true;
  SaveInput();
  std::fprintf(stderr, "fuzz_cortado %s: %s (%s) from %s; input saved to %s\n", target.name,
               problem, what.c_str(), origin.c_str(), g_crash_path);
  return false;
}

[[noreturn]] void Usage(const char* message) {
  std::fprintf(stderr,
               "fuzz_cortado: %s\nusage: fuzz_cortado TARGET --corpus DIR [--runs N] "
               "[--seed S] [--max-len BYTES] [--crash-dir DIR] | TARGET FILE... | "
               "TARGET --write-seeds DIR | --list\n",
               message);
  std::exit(2);
}

long long Number(const char* flag, const char* text) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0' || v < 0) {
    std::fprintf(stderr, "fuzz_cortado: %s: expected a non-negative integer, got '%s'\n", flag,
                 text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "--list") {
    for (const auto* t = cortado::fuzz::Targets(); t->name; ++t) {
      std::printf("%-12s %s\n", t->name, t->what);
    }
    return 0;
  }
  if (argc < 3) Usage("a target and a corpus or files are needed");
  const cortado::fuzz::Target* target = nullptr;
  for (const auto* t = cortado::fuzz::Targets(); t->name; ++t) {
    if (std::string(argv[1]) == t->name) target = t;
  }
  if (target == nullptr)
    Usage((std::string("unknown target '") + argv[1] + "' (see --list)").c_str());

  std::vector<fs::path> corpus_dirs, files;
  long long runs = 10000, seed = 1, max_len = 1 << 20;
  std::string crash_dir = ".";
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) Usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "--corpus") {
      corpus_dirs.emplace_back(value());
    } else if (a == "--runs") {
      runs = Number("--runs", value());
    } else if (a == "--seed") {
      seed = Number("--seed", value());
    } else if (a == "--max-len") {
      max_len = Number("--max-len", value());
    } else if (a == "--crash-dir") {
      crash_dir = value();
    } else if (a == "--write-seeds") {
      const fs::path dir = value();
      const auto seeds = cortado::fuzz::GeneratedSeeds(target->name);
      if (seeds.empty())
        Usage((std::string("target ") + target->name + " has no generated seeds").c_str());
      for (const auto& [name, bytes] : seeds) {
        std::ofstream out(dir / name, std::ios::binary);
        out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
        if (!out) Usage(("cannot write '" + (dir / name).string() + "'").c_str());
        std::printf("%s: %zu bytes\n", (dir / name).c_str(), bytes.size());
      }
      return 0;
    } else if (a.rfind("--", 0) == 0) {
      Usage(("unknown option " + a).c_str());
    } else {
      files.emplace_back(a);
    }
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, OnCrash);

  std::vector<Bytes> corpus;
  std::vector<std::string> names;
  for (const fs::path& dir : corpus_dirs) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      Usage(("--corpus '" + dir.string() + "' is not a folder").c_str());
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file()) entries.push_back(e.path());
    }
    std::sort(entries.begin(), entries.end());  // the same order, so the same inputs
    files.insert(files.end(), entries.begin(), entries.end());
  }
  for (const fs::path& f : files) {
    if (!fs::is_regular_file(f)) Usage(("'" + f.string() + "' is not a file").c_str());
    corpus.push_back(ReadFile(f));
    names.push_back(f.string());
  }
  if (corpus.empty()) Usage("the corpus is empty");

  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < corpus.size(); ++i) {
    if (!RunOne(*target, corpus[i], crash_dir, names[i])) return 1;
  }
  if (corpus_dirs.empty()) {
    std::printf("fuzz_cortado %s: %zu file(s) replayed, no finding\n", target->name, corpus.size());
    return 0;
  }
  Mutator mutator(static_cast<uint64_t>(seed));
  for (long long r = 0; r < runs; ++r) {
    const Bytes input = mutator.Mutate(corpus, static_cast<size_t>(max_len));
    if (!RunOne(*target, input, crash_dir,
                "run " + std::to_string(r) + " of seed " + std::to_string(seed))) {
      return 1;
    }
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("fuzz_cortado %s: %zu seed(s) and %lld mutated input(s) in %.1f s, no finding\n",
              target->name, corpus.size(), runs, s);
  return 0;
}
