// The LR finder's chart, an SVG document (train/lr_finder.h): the learning rate on a log x axis
// (a tick and label per decade), the loss on the y axis (about five round ticks), the raw loss
// as a thin grey line, the smoothed loss as the main curve, and vertical markers at the
// steepest-descent LR, the blow-up LR and blow-up / 10, each labelled with its value; a title and
// a legend. Elements a test or a script looks for carry ids: "smoothed" (a path, one point per
// finite smoothed loss), "loss", "x-axis", "y-axis", "steepest", "blowup", "blowup-over-10".
#pragma once

#include <string>

#include "train/lr_finder.h"

namespace crucible {

std::string LrFindSvg(const LrFindOptions& options, const LrFindResult& result,
                      const std::string& title);

}  // namespace crucible
