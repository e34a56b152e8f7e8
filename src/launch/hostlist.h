// Host names as schedulers write them: Slurm host lists ("n[1-3,7],gpu[01-02]-ib") expanded
// the way `scontrol show hostnames` does, host files (PBS_NODEFILE, --hostfile), and the one
// normalisation every comparison of host names goes through.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace crucible {

// "n[1-3],x5" -> {"n1", "n2", "n3", "x5"}. Zero padding follows the lower bound ("n[08-10]" ->
// n08 n09 n10); several bracket groups in one name expand as a product. Throws UsageError on
// malformed input (unbalanced brackets, a range that runs backwards).
std::vector<std::string> ExpandHostList(std::string_view list);

// A host file: one host per line, optionally followed by "slots=N" or ":N"; '#' comments and
// blank lines skipped. PBS lists a host once per MPI slot, so repeats are dropped (first
// occurrence keeps its place). Throws UsageError when the file cannot be read or names no host.
std::vector<std::string> ReadHostFile(const std::string& path);

// The form host names are compared in: lower case, no surrounding punctuation, and no domain
// ("N2.cluster.example.org:" -> "n2"). IPv4 addresses are kept whole.
std::string NormalizeHost(std::string_view host);

// Position of `host` in `hosts` after normalising both; -1 if absent.
int FindHost(const std::vector<std::string>& hosts, std::string_view host);

std::string JoinHosts(const std::vector<std::string>& hosts, std::string_view separator = ",");

// Hosts to leave out of a launch (crucible launch --exclude-file): the first word of each line,
// blank and '#' lines skipped, so `crucible yeet`'s failed_hosts.txt and launch's own
// bad_nodes.txt both work; an empty file excludes nothing. Throws UsageError when unreadable.
std::vector<std::string> ReadExcludeFile(const std::string& path);

}  // namespace crucible
