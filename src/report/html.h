// The page of `crucible report`: one self-contained HTML file (Chart.js and the data inline, no
// network reference), a header with the runs and their config summaries, a grid of charts in
// which every run has its colour, and tables for eval scores and launch attempts. A chart whose
// data no run has shows "no data" and why, instead of a canvas; the GRPO charts (reward, KL and
// entropy, completion length, step time split) are there only when some run is a GRPO run.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "report/run_data.h"

namespace crucible {

// The charts, as the page embeds them: a JSON array of
//   {"id", "title", "type": "line" | "bar" | "timeline", "x_title", "y_title", "empty",
//    "categories" (bar), "y_min", "y_max", "y_log" (optional), "y2_title", "y2_min", "y2_max"
//    (optional: a right-hand axis), "stacked" (optional, line), "datasets": [...]}
// where a line dataset is {"label", "run", "color", "dash", "points": [[x, y|null], ...]}, with
// "axis": "y2" when it is drawn against the right-hand axis, and "stack" (its run) and
// "fill_color" in a stacked chart (each filled down to the previous dataset of its stack), a bar
// dataset {"label", "run", "color", "values": [...], "errors": [...] (standard errors, or absent)}
// and a timeline dataset {"label", "run", "color", "bars": [[start_s, end_s], ...], "rows": [...],
// "details": [...]}. "empty" is "" when some dataset has data, else the reason there is none.
nlohmann::json ChartSpecs(const std::vector<RunData>& runs);

// The colour of run `index` (a fixed palette, repeated past its end).
std::string RunColor(size_t index);

// The whole page. `chart_js`: the text of Chart.js 3 (chart.min.js), inlined as it is.
std::string RenderReport(const std::vector<RunData>& runs, const std::string& title,
                         const std::string& chart_js);

}  // namespace crucible
