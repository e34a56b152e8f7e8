// crucible report RUN [RUN...]: one self-contained report.html of runs (their metrics, eval
// scores, checkpoint stalls, memory and launch attempts), charts overlaid, one colour per run.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "cli/command.h"
#include "common/error.h"
#include "common/files.h"
#include "common/strings.h"
#include "report/html.h"
#include "report/run_data.h"

namespace crucible {
namespace {

// Debian's libjs-chart.js (Chart.js 3, UMD build); CRUCIBLE_CHART_JS names another copy.
constexpr const char* kChartJs = "/usr/share/javascript/chart.js/chart.min.js";

struct ReportCliOptions {
  std::vector<std::string> runs;
  std::string output, title;
};

std::string ReadChartJs() {
  const char* from_env = std::getenv("CRUCIBLE_CHART_JS");
  const std::string path = from_env && *from_env ? from_env : kChartJs;
  if (!FileExists(path))
    throw Error(kExitFailure, "Chart.js not found at " + path +
                                  ": install Debian's libjs-chart.js (scripts/install-deps.sh "
                                  "libjs-chart.js)");
  return ReadFile(path);
}

CommandRun SetupReport(CLI::App& app) {
  auto o = std::make_shared<ReportCliOptions>();
  app.add_option("RUN", o->runs,
                 "run directories (job.dump_folder / launch --run-dir); several overlay on the "
                 "same charts, one colour each")
      ->required();
  app.add_option("-o,--output", o->output,
                 "the HTML file to write (default: report.html in the first RUN)");
  app.add_option("--title", o->title, "the page's title (default: \"Crucible report: RUN, ...\")");
  app.footer(
      "Reads metrics.jsonl, eval/validation.jsonl, eval/*.json (crucible eval --json), "
      "checkpoints.jsonl, launch/attempts.jsonl and launch/attempt-<k>.log; a missing source "
      "shows \"no data\". Chart.js comes inline from Debian's libjs-chart.js: the page opens "
      "offline. See docs/report.md.");
  return [o]() {
    const std::string chart_js = ReadChartJs();
    std::vector<RunData> runs;
    std::map<std::string, int> names;
    for (const std::string& dir : o->runs) {
      runs.push_back(LoadRun(dir));
      // Two runs of one folder name get told apart in the legend.
      const int seen = ++names[runs.back().name];
      if (seen > 1) runs.back().name += StrFormat(" (%d)", seen);
    }
    std::string title = o->title;
    if (title.empty()) {
      title = "Crucible report:";
      for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : " ") + runs[i].name;
    }
    const std::string output =
        o->output.empty() ? JoinPath(o->runs.front(), "report.html") : o->output;
    const std::string parent = ParentDirectory(output);
    if (!parent.empty() && !IsDirectory(parent))
      throw UsageError(output + ": folder " + parent + " does not exist");
    AtomicWriteFile(output, RenderReport(runs, title, chart_js));
    std::printf("wrote %s (self-contained: open it in a browser, no network needed)\n",
                output.c_str());
    return kExitOk;
  };
}

CommandRegistrar report_registrar(
    "report",
    "write report.html of one or more runs: loss, lr, grad norm, tokens/s, MFU, eval accuracy, "
    "checkpoint stalls, memory, launch attempts; GRPO reward, KL, entropy, length, step time",
    SetupReport);

}  // namespace
}  // namespace crucible
