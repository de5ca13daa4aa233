// `longtrain plot`: metrics JSONL in, one SVG out, written by hand (no plotting library).
// Every axis maps its data range exactly onto the plot area and the frame sits a few pixels
// outside it, so curves never touch the frame and a test can check the mapping by coordinates.
#include "longtrain/report/plot.h"

#include <nlohmann/json.hpp>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "longtrain/core/check.h"
#include "longtrain/core/files.h"

extern char** environ;

namespace lt::report {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------- reading

struct StepRecord {
  std::optional<double> loss, evalLoss, tokensPerS, mfu, peakRss;
};

std::string where(const std::string& path, int64_t line) { return path + ":" + std::to_string(line); }

// Absent, null (NaN/inf as nlohmann writes them) and non-finite all read as "no value".
std::optional<double> numberField(const json& j, const char* key, const std::string& at) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  LT_CHECK(it->is_number(), at, ": \"", key, "\" is ", it->dump(), ", expected a number (or null)");
  const double v = it->get<double>();
  return std::isfinite(v) ? std::optional<double>(v) : std::nullopt;
}

// The parser's message without its "[json.exception.parse_error.101] " prefix.
std::string parseMessage(const json::parse_error& e) {
  std::string m = e.what();
  const auto p = m.find("] ");
  return p == std::string::npos ? m : m.substr(p + 2);
}

bool blank(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isspace(c); });
}

void appendIf(std::vector<MetricPoint>& v, int64_t step, const std::optional<double>& x, double scale = 1) {
  if (x) v.push_back({step, *x * scale});
}

RunSeries toSeries(const std::map<int64_t, StepRecord>& byStep, std::string label) {
  RunSeries r;
  r.label = std::move(label);
  for (const auto& [step, rec] : byStep) {
    appendIf(r.loss, step, rec.loss);
    appendIf(r.evalLoss, step, rec.evalLoss);
    appendIf(r.tokensPerS, step, rec.tokensPerS);
    appendIf(r.mfuPercent, step, rec.mfu, 100.0);
    appendIf(r.peakMib, step, rec.peakRss, 1.0 / (1024.0 * 1024.0));
  }
  return r;
}

// ---------------------------------------------------------------- numbers and text

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", std::abs(v) < 0.05 ? 0.0 : v);
  return b;
}

std::string escapeXml(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default: o += c;
    }
  }
  return o;
}

// 1, 2 or 5 x 10^k nearest to `raw` (raw > 0).
double niceStep(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f < 1.5 ? 1 : f < 3.5 ? 2 : f < 7.5 ? 5 : 10) * mag;
}

// The next smaller 1-2-5 step: 10 -> 5 -> 2 -> 1 -> 0.5.
double smallerStep(double step) {
  const double mag = std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  const double f = std::round(step / mag);
  return f >= 5 ? 2 * mag : f >= 2 ? mag : 0.5 * mag;
}

std::vector<double> ticksAt(double lo, double hi, double step) {
  std::vector<double> t;
  for (double k = std::ceil(lo / step - 1e-9); k * step <= hi + 1e-9 * step; k += 1) t.push_back(k * step);
  return t;
}

// Tick labels share one suffix (k, M) and enough decimals for `step`.
struct TickFormat {
  double div = 1;
  const char* suffix = "";
};

TickFormat tickFormat(const std::vector<double>& ticks) {
  double maxAbs = 0;
  for (double t : ticks) maxAbs = std::max(maxAbs, std::abs(t));
  if (maxAbs >= 1e6) return {1e6, "M"};
  if (maxAbs >= 1e4) return {1e3, "k"};
  return {};
}

std::string formatTick(double v, double step, const TickFormat& f) {
  const int decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step / f.div) + 1e-9)));
  char b[48];
  const double x = std::abs(v) < step * 1e-6 ? 0.0 : v / f.div;
  std::snprintf(b, sizeof b, "%.*f%s", std::min(decimals, 12), x, f.suffix);
  return b;
}

constexpr double kCharWidth = 6.6;  // px per character of 11-12 px sans text, for layout only

// ---------------------------------------------------------------- geometry

struct Box {
  double x, y, w, h;
};

// A data range mapped onto [p0, p1] pixels; lo and hi are log10 values on a log axis.
struct Scale {
  double lo, hi, p0, p1;
  bool log = false;
  double at(double v) const {
    const double t = log ? std::log10(v) : v;
    return p0 + (t - lo) / (hi - lo) * (p1 - p0);
  }
};

struct Range {
  double lo = INFINITY, hi = -INFINITY;
  bool empty() const { return lo > hi; }
  void add(double v) { lo = std::min(lo, v), hi = std::max(hi, v); }
};

// A constant (or single-point) range is widened so the mapping never divides by zero.
Range padded(Range r, bool logAxis) {
  const double mag = std::max(std::abs(r.lo), std::abs(r.hi));
  if (r.hi - r.lo > 1e-4 * mag) return r;  // below, tick labels would need 7+ digits
  const double d = logAxis ? 0.05 : mag > 0 ? 0.05 * mag : 1.0;
  return {r.lo - d, r.hi + d};
}

constexpr double kOuter = 16, kGap = 20, kPanelHeight = 330, kLegendRow = 22, kTitleRow = 30;
constexpr double kLeft = 72, kRight = 18, kTop = 34, kBottom = 48, kPad = 6;
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

const char* colourOf(size_t run) { return kPalette[run % std::size(kPalette)]; }

// ---------------------------------------------------------------- panels

enum class PanelKind { kLoss, kTokens, kMfu, kMemory };

struct PanelSpec {
  PanelKind kind;
  const char* id;
  const char* title;
  const char* yLabel;
  std::vector<MetricPoint> RunSeries::*series;
};

const PanelSpec kPanels[] = {
    {PanelKind::kLoss, "loss", "Loss", "loss", &RunSeries::loss},
    {PanelKind::kTokens, "tokens_per_s", "Throughput", "tokens/s", &RunSeries::tokensPerS},
    {PanelKind::kMfu, "mfu", "MFU", "MFU (%)", &RunSeries::mfuPercent},
    {PanelKind::kMemory, "peak_memory", "Peak memory", "peak RSS (MiB)", &RunSeries::peakMib},
};

// The series a panel draws for one run: the loss panel adds eval loss.
std::vector<const std::vector<MetricPoint>*> seriesOf(const PanelSpec& p, const RunSeries& r) {
  std::vector<const std::vector<MetricPoint>*> s{&(r.*p.series)};
  if (p.kind == PanelKind::kLoss) s.push_back(&r.evalLoss);
  return s;
}

bool drawable(double v, bool logAxis) { return std::isfinite(v) && (!logAxis || v > 0); }

Range valueRange(const PanelSpec& p, const std::vector<RunSeries>& runs, bool logAxis) {
  Range r;
  for (const auto& run : runs)
    for (const auto* s : seriesOf(p, run))
      for (const auto& pt : *s)
        if (drawable(pt.value, logAxis)) r.add(logAxis ? std::log10(pt.value) : pt.value);
  return r;
}

Range stepRange(const std::vector<RunSeries>& runs) {
  Range r;
  for (const auto& p : kPanels)
    for (const auto& run : runs)
      for (const auto* s : seriesOf(p, run))
        for (const auto& pt : *s)
          if (std::isfinite(pt.value)) r.add(static_cast<double>(pt.step));
  if (!r.empty() && r.lo == r.hi) return {r.lo - 1, r.hi + 1};
  return r;
}

std::vector<double> stepTicks(Range r) {
  return ticksAt(r.lo, r.hi, std::max(1.0, niceStep((r.hi - r.lo) / 6)));
}

// Log axis: 1-2-5 x 10^k values when at least three fall inside, else linear ticks (a loss
// curve often spans less than one decade); past 2.5 decades only powers of ten, at most ~8.
std::vector<double> logTicks(Range r) {
  const double span = r.hi - r.lo;
  const std::vector<double> mantissas = span > 2.5 ? std::vector<double>{1.0} : std::vector<double>{1.0, 2.0, 5.0};
  const double stride = std::max(1.0, std::ceil(span / 8));
  std::vector<double> t;
  for (double k = std::floor(r.lo / stride) * stride; k <= std::ceil(r.hi); k += stride)
    for (double m : mantissas) {
      const double v = m * std::pow(10.0, k);
      if (std::log10(v) >= r.lo - 1e-9 && std::log10(v) <= r.hi + 1e-9) t.push_back(v);
    }
  return t.size() >= 3 || span > 2.5 ? t : niceTicks(std::pow(10.0, r.lo), std::pow(10.0, r.hi), 5);
}

// The spacing a tick label's decimals follow: the neighbour gap, or the value's own digit.
double tickSpacing(const std::vector<double>& ticks, size_t i, bool logAxis) {
  if (logAxis && ticks.size() > 1 && ticks[1] / ticks[0] > 1.9)
    return std::pow(10.0, std::floor(std::log10(ticks[i]) + 1e-9));
  return ticks.size() > 1 ? ticks[1] - ticks[0] : std::max(std::abs(ticks[0]), 1.0);
}

void text(std::string& o, double x, double y, const std::string& s, const std::string& extra = "") {
  o += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\"" + extra + ">" + escapeXml(s) + "</text>\n";
}

void line(std::string& o, double x1, double y1, double x2, double y2, const std::string& style) {
  o += "<line x1=\"" + num(x1) + "\" y1=\"" + num(y1) + "\" x2=\"" + num(x2) + "\" y2=\"" + num(y2) + "\" " + style +
       "/>\n";
}

void drawYAxis(std::string& o, const Box& frame, const Scale& y, const std::vector<double>& ticks) {
  const TickFormat f = tickFormat(ticks);
  for (size_t i = 0; i < ticks.size(); ++i) {
    const double py = y.at(ticks[i]);
    line(o, frame.x, py, frame.x + frame.w, py, "stroke=\"#e6e6e6\"");
    line(o, frame.x - 4, py, frame.x, py, "stroke=\"#666\"");
    text(o, frame.x - 7, py + 4, formatTick(ticks[i], tickSpacing(ticks, i, y.log), f), " text-anchor=\"end\"");
  }
}

void drawXAxis(std::string& o, const Box& frame, const Scale& x, const std::vector<double>& ticks) {
  const TickFormat f = tickFormat(ticks);
  for (double t : ticks) {
    const double px = x.at(t);
    line(o, px, frame.y, px, frame.y + frame.h, "stroke=\"#e6e6e6\"");
    line(o, px, frame.y + frame.h, px, frame.y + frame.h + 4, "stroke=\"#666\"");
    text(o, px, frame.y + frame.h + 17, formatTick(t, tickSpacing(ticks, 0, false), f), " text-anchor=\"middle\"");
  }
}

// One curve: a polyline, plus a marker per point for eval (dashed) or when it is a single point.
void drawSeries(std::string& o, const std::vector<MetricPoint>& s, const Scale& x, const Scale& y, size_t run,
                bool eval, const char* panel) {
  std::vector<MetricPoint> shown;  // in step order, whatever order the caller gave
  std::copy_if(s.begin(), s.end(), std::back_inserter(shown),
               [&](const MetricPoint& p) { return drawable(p.value, y.log); });
  if (shown.empty()) return;
  std::stable_sort(shown.begin(), shown.end(),
                   [](const MetricPoint& a, const MetricPoint& b) { return a.step < b.step; });
  std::string pts;
  for (const auto& p : shown) pts += (pts.empty() ? "" : " ") + num(x.at(double(p.step))) + "," + num(y.at(p.value));
  const std::string colour = colourOf(run);
  const bool dense = shown.size() > (x.p1 - x.p0) / 2;  // over a point per 2 px: thinner, or noise fills the panel
  o += "<polyline class=\"series\" data-panel=\"" + std::string(panel) + "\" data-run=\"" + std::to_string(run) +
       "\" data-kind=\"" + (eval ? "eval" : "train") + "\" fill=\"none\" stroke=\"" + colour +
       "\" stroke-opacity=\"0.85\" stroke-width=\"" + (dense ? "1" : "1.6") + "\" stroke-linejoin=\"round\"" +
       (eval ? " stroke-dasharray=\"6 3\"" : "") +
       " points=\"" + pts + "\"/>\n";
  if (!eval && shown.size() > 1) return;
  o += "<g fill=\"" + colour + "\">";
  for (const auto& p : shown)
    o += "<circle cx=\"" + num(x.at(double(p.step))) + "\" cy=\"" + num(y.at(p.value)) + "\" r=\"2.6\"/>";
  o += "</g>\n";
}

// The loss panel's key, right-aligned in its title row: solid is train, dashed is eval.
void drawLossKey(std::string& o, const Box& frame, double y) {
  const double x = frame.x + frame.w;
  line(o, x - 138, y - 4, x - 116, y - 4, "stroke=\"#444\" stroke-width=\"1.6\"");
  text(o, x - 111, y, "train", " font-size=\"11\" fill=\"#444\"");
  line(o, x - 58, y - 4, x - 36, y - 4, "stroke=\"#444\" stroke-width=\"1.6\" stroke-dasharray=\"6 3\"");
  o += "<circle cx=\"" + num(x - 47) + "\" cy=\"" + num(y - 4) + "\" r=\"2.6\" fill=\"#444\"/>\n";
  text(o, x - 31, y, "eval", " font-size=\"11\" fill=\"#444\"");
}

void drawFrame(std::string& o, const Box& frame) {
  o += "<rect x=\"" + num(frame.x) + "\" y=\"" + num(frame.y) + "\" width=\"" + num(frame.w) + "\" height=\"" +
       num(frame.h) + "\" fill=\"none\" stroke=\"#999\"/>\n";
}

bool anyEval(const std::vector<RunSeries>& runs) {
  return std::any_of(runs.begin(), runs.end(), [](const RunSeries& r) { return !r.evalLoss.empty(); });
}

void drawPanel(std::string& o, const PanelSpec& p, const Box& box, const std::vector<RunSeries>& runs, Range steps,
               const PlotOptions& opt) {
  const bool logAxis = p.kind == PanelKind::kLoss && opt.logLoss;
  const Box frame{box.x + kLeft, box.y + kTop, box.w - kLeft - kRight, box.h - kTop - kBottom};
  const Box area{frame.x + kPad, frame.y + kPad, frame.w - 2 * kPad, frame.h - 2 * kPad};
  o += "<g class=\"panel\" data-panel=\"" + std::string(p.id) + "\" data-plot-area=\"" + num(area.x) + " " +
       num(area.y) + " " + num(area.w) + " " + num(area.h) + "\">\n";
  text(o, frame.x, box.y + 20, std::string(p.title) + (logAxis ? " (log scale)" : ""),
       " font-size=\"14\" font-weight=\"bold\"");
  const Range values = valueRange(p, runs, logAxis);
  if (values.empty() || steps.empty()) {
    drawFrame(o, frame);
    text(o, frame.x + frame.w / 2, frame.y + frame.h / 2, "no data", " text-anchor=\"middle\" fill=\"#999\"");
    o += "</g>\n";
    return;
  }
  const Range v = padded(values, logAxis);
  const Scale x{steps.lo, steps.hi, area.x, area.x + area.w};
  const Scale y{v.lo, v.hi, area.y + area.h, area.y, logAxis};
  drawYAxis(o, frame, y, logAxis ? logTicks(v) : niceTicks(v.lo, v.hi, 5));
  drawXAxis(o, frame, x, stepTicks(steps));
  drawFrame(o, frame);
  text(o, frame.x + frame.w / 2, box.y + box.h - 8, "step", " text-anchor=\"middle\"");
  const double ly = frame.y + frame.h / 2, lx = box.x + 16;
  text(o, lx, ly, p.yLabel, " text-anchor=\"middle\" transform=\"rotate(-90 " + num(lx) + " " + num(ly) + ")\"");
  if (p.kind == PanelKind::kLoss && anyEval(runs)) drawLossKey(o, frame, box.y + 20);
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto s = seriesOf(p, runs[r]);
    for (size_t k = 0; k < s.size(); ++k) drawSeries(o, *s[k], x, y, r, k == 1, p.id);
  }
  o += "</g>\n";
}

// ---------------------------------------------------------------- legend

struct LegendItem {
  double x, y;
};

// Entries flow left to right and wrap at the page width.
std::vector<LegendItem> legendLayout(const std::vector<RunSeries>& runs, double x0, double y0, double width) {
  std::vector<LegendItem> items;
  double x = x0, y = y0;
  for (const auto& r : runs) {
    const double w = 34 + kCharWidth * r.label.size() + 18;
    if (x > x0 && x + w > x0 + width) x = x0, y += kLegendRow;
    items.push_back({x, y});
    x += w;
  }
  return items;
}

void drawLegend(std::string& o, const std::vector<RunSeries>& runs, const std::vector<LegendItem>& items) {
  o += "<g class=\"legend\">\n";
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto& it = items[r];
    line(o, it.x, it.y - 4, it.x + 26, it.y - 4, "stroke=\"" + std::string(colourOf(r)) + "\" stroke-width=\"3\"");
    text(o, it.x + 34, it.y, runs[r].label);
  }
  o += "</g>\n";
}

// ---------------------------------------------------------------- writing

struct TempFile {
  std::string path;
  ~TempFile() {
    std::error_code ec;
    if (!path.empty()) fs::remove(path, ec);
  }
};

void writeFile(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  LT_CHECK(f, "cannot write ", path, ": ", std::strerror(errno));
  f << content;
  f.close();
  LT_CHECK(f, "writing ", path, " failed: ", std::strerror(errno));
}

void renameInto(TempFile& tmp, const std::string& out) {
  std::error_code ec;
  fs::rename(tmp.path, out, ec);
  LT_CHECK(!ec, "cannot move ", tmp.path, " to ", out, ": ", ec.message());
  tmp.path.clear();
}

std::string lowerExtension(const std::string& path) {
  std::string e = fs::path(path).extension().string();
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  return e;
}

// Runs rsvg-convert without a shell (no quoting of user paths); false when it is not installed.
bool rsvgConvert(const std::string& svg, const std::string& png) {
  const char* argv[] = {"rsvg-convert", "--background-color=white", "-o", png.c_str(), svg.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, "rsvg-convert", nullptr, nullptr, const_cast<char* const*>(argv), environ);
  if (rc == ENOENT) return false;
  LT_CHECK(rc == 0, "cannot run rsvg-convert: ", std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  LT_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rsvg-convert failed converting ", svg, " to ", png);
  return true;
}

}  // namespace

RunSeries readMetrics(const std::string& path) {
  std::istringstream in(readInputFile(path, "metrics file '" + path + "'"));  // a FIFO would block
  std::map<int64_t, StepRecord> byStep;  // a later record of a step replaces the earlier one
  std::string raw;
  for (int64_t lineNo = 1; std::getline(in, raw); ++lineNo) {
    if (blank(raw)) continue;
    json j;
    try {
      j = json::parse(raw, [&](int depth, json::parse_event_t, json&) {
        LT_CHECK(depth <= 64, where(path, lineNo), ": nested deeper than 64 levels; a metrics record is flat");
        return true;
      });
    } catch (const json::parse_error& e) {
      if (in.eof()) break;  // an unterminated last line: the run is still writing it
      LT_CHECK(false, where(path, lineNo), ": not JSON (", parseMessage(e),
               "); expected one JSON object per line, as `longtrain train --metrics` writes");
    }
    LT_CHECK(j.is_object(), where(path, lineNo), ": a JSON ", j.type_name(), ", expected one JSON object per line");
    if (!j.contains("step")) continue;
    LT_CHECK(j["step"].is_number_integer(), where(path, lineNo), ": \"step\" is ", j["step"].dump(),
             ", expected an integer");
    const std::string at = where(path, lineNo);
    byStep[j["step"].get<int64_t>()] = {numberField(j, "loss", at), numberField(j, "eval_loss", at),
                                        numberField(j, "tokens_per_s", at), numberField(j, "mfu", at),
                                        numberField(j, "peak_rss_bytes", at)};
  }
  LT_CHECK(!byStep.empty(), path, ": no line has a \"step\"; expected the JSONL that `longtrain train --metrics` "
                            "writes");
  return toSeries(byStep, fs::path(path).stem().string());
}

std::vector<RunSeries> readRuns(const std::vector<std::string>& paths, const std::vector<std::string>& labels) {
  LT_CHECK(!paths.empty(), "no metrics files given");
  LT_CHECK(labels.empty() || labels.size() == paths.size(), "got ", labels.size(), " labels for ", paths.size(),
           " metrics files; give one --label per file, in the files' order, or none");
  std::vector<RunSeries> runs;
  std::multiset<std::string> stems;
  for (const auto& p : paths) stems.insert(fs::path(p).stem().string());
  for (size_t i = 0; i < paths.size(); ++i) {
    runs.push_back(readMetrics(paths[i]));
    const fs::path p(paths[i]);
    if (!labels.empty()) runs.back().label = labels[i];
    else if (stems.count(runs.back().label) > 1)
      runs.back().label = (p.parent_path().filename() / p.stem()).string();
  }
  return runs;
}

std::vector<double> niceTicks(double lo, double hi, int target) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {lo};
  double step = niceStep((hi - lo) / std::max(1, target));
  auto t = ticksAt(lo, hi, step);
  while (t.size() < 2) t = ticksAt(lo, hi, step = smallerStep(step));
  return t;
}

std::string renderSvg(const std::vector<RunSeries>& runs, const PlotOptions& opt) {
  LT_CHECK(!runs.empty(), "nothing to plot: no runs");
  LT_CHECK(opt.width >= 400, "plot width ", opt.width, " px is too small; use at least 400");
  const double width = opt.width;
  const double legendTop = kOuter + (opt.title.empty() ? 0 : kTitleRow) + 12;
  const auto legend = legendLayout(runs, kOuter + kLeft, legendTop, width - 2 * kOuter - kLeft);
  const double panelsTop = legend.back().y + 14;
  const double height = panelsTop + 2 * kPanelHeight + kGap + kOuter;
  std::string o = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width) + "\" height=\"" + num(height) +
                  "\" viewBox=\"0 0 " + num(width) + " " + num(height) +
                  "\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\" fill=\"#222\">\n";
  o += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  if (!opt.title.empty())
    text(o, width / 2, kOuter + 18, opt.title, " font-size=\"16\" font-weight=\"bold\" text-anchor=\"middle\"");
  drawLegend(o, runs, legend);
  const Range steps = stepRange(runs);
  const double panelWidth = (width - 2 * kOuter - kGap) / 2;
  for (size_t i = 0; i < std::size(kPanels); ++i) {
    const Box box{kOuter + (i % 2) * (panelWidth + kGap), panelsTop + (i / 2) * (kPanelHeight + kGap), panelWidth,
                  kPanelHeight};
    drawPanel(o, kPanels[i], box, runs, steps, opt);
  }
  return o + "</svg>\n";
}

std::vector<std::string> emptyPanels(const std::vector<RunSeries>& runs) {
  std::vector<std::string> out;
  for (const auto& p : kPanels)
    if (valueRange(p, runs, false).empty()) out.push_back(p.title);
  return out;
}

void writePlot(const std::vector<RunSeries>& runs, const std::string& outPath, const PlotOptions& opt) {
  const std::string ext = lowerExtension(outPath);
  LT_CHECK(ext == ".svg" || ext == ".png", "--out ", outPath, ": expected a file ending in .svg or .png");
  const std::string svg = renderSvg(runs, opt);
  const std::string stem = outPath + ".tmp" + std::to_string(getpid());
  TempFile svgTmp{stem + ".svg"};
  writeFile(svgTmp.path, svg);
  if (ext == ".svg") return renameInto(svgTmp, outPath);
  TempFile pngTmp{stem + ".png"};
  LT_CHECK(rsvgConvert(svgTmp.path, pngTmp.path), "--out ", outPath, " needs rsvg-convert, which is not on PATH; "
           "install it (Debian: apt-get install librsvg2-bin) or write a .svg");
  renameInto(pngTmp, outPath);
}

}  // namespace lt::report
