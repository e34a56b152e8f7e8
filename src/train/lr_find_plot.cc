#include "train/lr_find_plot.h"

#include <algorithm>
#include <cmath>

#include "common/strings.h"

namespace crucible {

namespace {

constexpr double kWidth = 800, kHeight = 500;
constexpr double kLeft = 80, kRight = kWidth - 30, kTop = 70, kBottom = kHeight - 60;

// A round tick spacing (1, 2 or 5 times a power of ten) for about `span` / 5.
double NiceStep(double span) {
  const double raw = span / 5.0;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0})
    if (m * power >= raw) return m * power;
  return 10.0 * power;
}

// Maps data to the plot area: x = log10(lr) over [x0, x1] decades, y = loss over [y0, y1].
struct Axes {
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  double X(double lr) const { return kLeft + (std::log10(lr) - x0) / (x1 - x0) * (kRight - kLeft); }
  double Y(double loss) const {
    const double clamped = std::clamp(loss, y0, y1);
    return kBottom - (clamped - y0) / (y1 - y0) * (kBottom - kTop);
  }
};

Axes ChooseAxes(const LrFindOptions& options, const LrFindResult& result) {
  Axes axes;
  axes.x0 = std::floor(std::log10(options.min_lr) + 1e-9);
  axes.x1 = std::ceil(std::log10(options.max_lr) - 1e-9);
  if (axes.x1 <= axes.x0) axes.x1 = axes.x0 + 1;
  // The y range covers the smoothed curve (the raw loss is clamped to it, so one wild step
  // does not flatten the curve a person reads).
  double low = INFINITY, high = -INFINITY;
  for (const LrSweepPoint& p : result.points) {
    if (!std::isfinite(p.smoothed)) continue;
    low = std::min(low, p.smoothed);
    high = std::max(high, p.smoothed);
  }
  if (!std::isfinite(low)) low = 0, high = 1;
  if (high - low < 1e-6) high = low + 1;
  const double pad = 0.05 * (high - low);
  axes.y0 = low - pad;
  axes.y1 = high + pad;
  return axes;
}

std::string Text(double x, double y, const std::string& anchor, const std::string& text,
                 const std::string& extra = "") {
  return StrFormat("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>%s</text>\n", x, y,
                   anchor.c_str(), extra.c_str(), XmlEscape(text).c_str());
}

std::string XAxis(const Axes& axes) {
  std::string svg = StrFormat(
      "<line id=\"x-axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
      kLeft, kBottom, kRight, kBottom);
  const int decades = static_cast<int>(axes.x1 - axes.x0);
  const int every = decades > 12 ? 2 : 1;
  for (int d = static_cast<int>(axes.x0); d <= static_cast<int>(axes.x1); d += every) {
    const double x = axes.X(std::pow(10.0, d));
    svg += StrFormat(
        "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
        x, kTop, x, kBottom);
    svg += StrFormat(
        "<line class=\"tick\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
        x, kBottom, x, kBottom + 6);
    svg += Text(x, kBottom + 20, "middle", StrFormat("1e%d", d), " class=\"xtick\"");
  }
  svg += Text((kLeft + kRight) / 2, kHeight - 18, "middle", "learning rate (log scale)",
              " class=\"xlabel\"");
  return svg;
}

std::string YAxis(const Axes& axes) {
  std::string svg = StrFormat(
      "<line id=\"y-axis\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
      kLeft, kTop, kLeft, kBottom);
  const double step = NiceStep(axes.y1 - axes.y0);
  for (double v = std::ceil(axes.y0 / step) * step; v <= axes.y1 + 1e-12; v += step) {
    const double y = axes.Y(v);
    svg += StrFormat(
        "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>\n",
        kLeft, y, kRight, y);
    svg += StrFormat(
        "<line class=\"tick\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n",
        kLeft - 6, y, kLeft, y);
    svg += Text(kLeft - 10, y + 4, "end", StrFormat("%g", std::abs(v) < step / 2 ? 0.0 : v),
                " class=\"ytick\"");
  }
  svg += StrFormat(
      "<text class=\"ylabel\" x=\"20\" y=\"%.1f\" text-anchor=\"middle\" "
      "transform=\"rotate(-90 20 %.1f)\">loss</text>\n",
      (kTop + kBottom) / 2, (kTop + kBottom) / 2);
  return svg;
}

// The raw loss (a polyline of the finite points) and the smoothed loss (a path).
std::string Curves(const Axes& axes, const LrFindResult& result) {
  std::string raw, smoothed;
  for (const LrSweepPoint& p : result.points) {
    if (std::isfinite(p.loss)) raw += StrFormat("%.2f,%.2f ", axes.X(p.lr), axes.Y(p.loss));
    if (std::isfinite(p.smoothed))
      smoothed +=
          StrFormat("%s%.2f %.2f ", smoothed.empty() ? "M" : "L", axes.X(p.lr), axes.Y(p.smoothed));
  }
  return StrFormat(
      "<polyline id=\"loss\" points=\"%s\" fill=\"none\" stroke=\"#bbb\" stroke-width=\"1\"/>\n"
      "<path id=\"smoothed\" d=\"%s\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\n",
      Trim(raw).c_str(), Trim(smoothed).c_str());
}

std::string Marker(const Axes& axes, const std::string& id, double lr, const std::string& color,
                   const std::string& label, int row) {
  const double x = axes.X(lr);
  return StrFormat(
             "<line id=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
             "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n",
             id.c_str(), x, kTop, x, kBottom, color.c_str()) +
         // Labelled on the side of the line with more room, so no label runs off the chart.
         Text(x < (kLeft + kRight) / 2 ? x + 4 : x - 4, kTop + 14 + 14 * row,
              x < (kLeft + kRight) / 2 ? "start" : "end", StrFormat("%s %.3g", label.c_str(), lr),
              StrFormat(" class=\"marker-label\" fill=\"%s\"", color.c_str()));
}

}  // namespace

std::string LrFindSvg(const LrFindOptions& options, const LrFindResult& result,
                      const std::string& title) {
  const Axes axes = ChooseAxes(options, result);
  std::string svg = StrFormat(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 "
      "%.0f %.0f\" font-family=\"sans-serif\" font-size=\"12\">\n"
      "<title>%s</title>\n"
      "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      kWidth, kHeight, kWidth, kHeight, XmlEscape(title).c_str());
  svg += Text(kWidth / 2, 28, "middle", title, " class=\"title\" font-size=\"16\"");
  svg += XAxis(axes) + YAxis(axes) + Curves(axes, result);
  if (result.steepest_lr)
    svg += Marker(axes, "steepest", *result.steepest_lr, "#2ca02c", "steepest descent", 0);
  if (result.blowup_step) {
    svg += Marker(axes, "blowup", result.blowup_lr, "#d62728", "blow-up", 1);
    svg += Marker(axes, "blowup-over-10", result.blowup_lr / 10, "#ff7f0e", "blow-up/10", 2);
  }
  // The legend, one row between the title and the plot, clear of the curves.
  const double legend_y = kTop - 20;
  svg += StrFormat(
      "<g id=\"legend\">\n"
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#bbb\"/>\n",
      kLeft, legend_y, kLeft + 25, legend_y);
  svg += Text(kLeft + 30, legend_y + 4, "start", "loss");
  svg += StrFormat(
      "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#1f77b4\" "
      "stroke-width=\"2\"/>\n",
      kLeft + 80, legend_y, kLeft + 105, legend_y);
  svg += Text(kLeft + 110, legend_y + 4, "start",
              StrFormat("smoothed (EMA %g, bias-corrected)", options.smoothing));
  svg += "</g>\n</svg>\n";
  return svg;
}

}  // namespace crucible
