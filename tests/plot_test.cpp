// report/: reading --metrics JSONL (skipped lines, resumed steps, errors by file:line), the SVG's
// structure (one curve per run per panel with data, legend, balanced tags), the data-to-pixel
// mapping read back from the SVG's own coordinates, degenerate series, and the `plot` command.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iterator>
#include <sstream>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "longtrain/core/check.h"
#include "longtrain/report/plot.h"

#include "testing.h"

namespace {

namespace fs = std::filesystem;
using lt::report::MetricPoint;
using lt::report::RunSeries;

fs::path writeText(const fs::path& dir, const std::string& name, const std::string& text) {
  fs::create_directories(dir);
  std::ofstream(dir / name) << text;
  return dir / name;
}

// A metrics line as the trainer writes it; eval fields when evalLoss >= 0.
std::string metricsLine(int step, double loss, double evalLoss = -1) {
  std::string s = "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(loss) +
                  ",\"tokens_per_s\":" + std::to_string(1000 + 10 * step) + ",\"mfu\":0.25" +
                  ",\"peak_rss_bytes\":" + std::to_string((500 + step) * 1048576LL);
  if (evalLoss >= 0) s += ",\"eval_loss\":" + std::to_string(evalLoss) + ",\"eval_accuracy\":0.5";
  return s + "}\n";
}

std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const lt::Error& e) {
    return e.what();
  }
  return "(no error)";
}

struct Polyline {
  std::string panel, kind;
  int run;
  std::vector<std::pair<double, double>> points;
};

std::string attr(const std::string& tag, const std::string& name) {
  std::smatch m;
  return std::regex_search(tag, m, std::regex(" " + name + "=\"([^\"]*)\"")) ? m[1].str() : "";
}

std::vector<std::pair<double, double>> parsePoints(const std::string& s) {
  std::vector<std::pair<double, double>> v;
  std::istringstream in(s);
  std::string xy;
  while (in >> xy) {
    const auto c = xy.find(',');
    v.emplace_back(std::stod(xy.substr(0, c)), std::stod(xy.substr(c + 1)));
  }
  return v;
}

std::vector<Polyline> polylines(const std::string& svg) {
  std::vector<Polyline> out;
  const std::regex re("<polyline[^>]*/>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    const std::string tag = it->str();
    out.push_back({attr(tag, "data-panel"), attr(tag, "data-kind"), std::stoi(attr(tag, "data-run")),
                   parsePoints(attr(tag, "points"))});
  }
  return out;
}

struct Area {
  double x, y, w, h;
};

std::map<std::string, Area> plotAreas(const std::string& svg) {
  std::map<std::string, Area> out;
  const std::regex re("<g class=\"panel\"[^>]*>");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), re); it != std::sregex_iterator(); ++it) {
    std::istringstream in(attr(it->str(), "data-plot-area"));
    Area a{};
    in >> a.x >> a.y >> a.w >> a.h;
    out[attr(it->str(), "data-panel")] = a;
  }
  return out;
}

// Every <tag> is closed by </tag> in nesting order or is self-closing; no stray '<' or '&'.
bool balancedTags(const std::string& svg) {
  std::vector<std::string> open;
  for (size_t i = svg.find('<'); i != std::string::npos; i = svg.find('<', i + 1)) {
    const size_t end = svg.find('>', i);
    if (end == std::string::npos) return false;
    const std::string tag = svg.substr(i + 1, end - i - 1);
    if (tag.find('<') != std::string::npos) return false;
    if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return false;
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \n")));
    }
  }
  for (size_t i = svg.find('&'); i != std::string::npos; i = svg.find('&', i + 1))
    if (!std::regex_search(svg.substr(i, 7), std::regex("^&(amp|lt|gt|quot|apos);"))) return false;
  return open.empty();
}

bool containsNanOrInf(std::string svg) {
  for (auto& c : svg) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return svg.find("nan") != std::string::npos || svg.find("inf") != std::string::npos;
}

lt::report::PlotOptions logLossOptions(bool logLoss = true) {
  lt::report::PlotOptions o;
  o.logLoss = logLoss;
  return o;
}

RunSeries lossOnly(const std::string& label, std::vector<MetricPoint> loss) {
  RunSeries r;
  r.label = label;
  r.loss = std::move(loss);
  return r;
}

TEST(Plot, ReadsMetricsSkippingLinesWithoutStepAndLetsALaterRecordWin) {
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/read");
  // A header-like line without "step", a blank line, steps out of order, and a resume that
  // re-ran step 2 (the later record wins), with eval only on step 3.
  const auto p = writeText(dir, "run_a.jsonl",
                           "{\"config\":\"x\"}\n" + metricsLine(1, 4.0) + "\n" + metricsLine(3, 3.0, 3.5) +
                               metricsLine(2, 9.0) + metricsLine(2, 3.6) + "{\"step\":4,\"loss\":null}\n");
  const RunSeries r = lt::report::readMetrics(p.string());
  EXPECT_EQ(r.label, "run_a");
  ASSERT_EQ(r.loss.size(), 3u);  // step 4's NaN loss (written as null) is no point
  EXPECT_EQ(r.loss[0].step, 1);
  EXPECT_EQ(r.loss[1].step, 2);
  EXPECT_DOUBLE_EQ(r.loss[1].value, 3.6);
  EXPECT_EQ(r.loss[2].step, 3);
  ASSERT_EQ(r.evalLoss.size(), 1u);
  EXPECT_EQ(r.evalLoss[0].step, 3);
  EXPECT_DOUBLE_EQ(r.mfuPercent[0].value, 25.0);
  EXPECT_DOUBLE_EQ(r.peakMib[0].value, 501.0);
  EXPECT_DOUBLE_EQ(r.tokensPerS[0].value, 1010.0);
}

TEST(Plot, MalformedLinesNameFileAndLine) {
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/malformed");
  const auto bad = writeText(dir, "bad.jsonl", metricsLine(1, 4.0) + metricsLine(2, 3.9) + "{\"step\": 3, \"loss\n" +
                                                   metricsLine(4, 3.7));
  std::string e = errorOf([&] { lt::report::readMetrics(bad.string()); });
  EXPECT_NE(e.find(bad.string() + ":3: not JSON"), std::string::npos) << e;

  const auto typed = writeText(dir, "typed.jsonl", metricsLine(1, 4.0) + "{\"step\":2,\"loss\":\"high\"}\n");
  e = errorOf([&] { lt::report::readMetrics(typed.string()); });
  EXPECT_NE(e.find(typed.string() + ":2: \"loss\" is \"high\", expected a number"), std::string::npos) << e;

  const auto array = writeText(dir, "array.jsonl", "[1, 2]\n");
  e = errorOf([&] { lt::report::readMetrics(array.string()); });
  EXPECT_NE(e.find(array.string() + ":1: a JSON array, expected one JSON object per line"), std::string::npos) << e;

  const auto none = writeText(dir, "none.jsonl", "{\"a\":1}\n");
  e = errorOf([&] { lt::report::readMetrics(none.string()); });
  EXPECT_NE(e.find("no line has a \"step\""), std::string::npos) << e;
  e = errorOf([&] { lt::report::readMetrics((dir / "missing.jsonl").string()); });
  EXPECT_NE(e.find("metrics file '" + (dir / "missing.jsonl").string() + "' does not exist"), std::string::npos) << e;
}

TEST(Plot, UnterminatedLastLineOfARunStillWritingIsSkipped) {
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/partial");
  const auto p = writeText(dir, "live.jsonl", metricsLine(1, 4.0) + metricsLine(2, 3.9) + "{\"step\":3,\"lo");
  EXPECT_EQ(lt::report::readMetrics(p.string()).loss.size(), 2u);
}

TEST(Plot, OneCurvePerRunPerPanelWithDataAndALegend) {
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/render");
  std::string a, b;
  for (int s = 1; s <= 20; ++s) {
    a += metricsLine(s, 5.0 - 0.1 * s, s % 10 == 0 ? 5.2 - 0.1 * s : -1);
    b += "{\"step\":" + std::to_string(s) + ",\"loss\":" + std::to_string(4.0 - 0.05 * s) + "}\n";  // loss only
  }
  const auto runs = lt::report::readRuns({writeText(dir, "a.jsonl", a).string(), writeText(dir, "b.jsonl", b).string()},
                                         {"base <lr=1e-3>", "warm & fast"});
  const std::string svg = lt::report::renderSvg(runs);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_TRUE(balancedTags(svg));
  EXPECT_NE(svg.find(">base &lt;lr=1e-3&gt;</text>"), std::string::npos);  // legend labels, escaped
  EXPECT_NE(svg.find(">warm &amp; fast</text>"), std::string::npos);
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_EQ(svg.find("href"), std::string::npos);  // self-contained: no links, images or fonts

  std::map<std::string, int> trainCurves;
  int evalCurves = 0;
  for (const auto& p : polylines(svg)) {
    if (p.kind == "train") ++trainCurves[p.panel + "/" + std::to_string(p.run)];
    if (p.kind == "eval") {
      ++evalCurves;
      EXPECT_EQ(p.panel, "loss");
      EXPECT_EQ(p.run, 0);
      EXPECT_EQ(p.points.size(), 2u);  // steps 10 and 20
    }
  }
  const std::map<std::string, int> expected = {{"loss/0", 1}, {"loss/1", 1}, {"tokens_per_s/0", 1},
                                               {"mfu/0", 1},  {"peak_memory/0", 1}};
  EXPECT_EQ(trainCurves, expected);  // run b has no tokens/s, MFU or memory: no curve there
  EXPECT_EQ(evalCurves, 1);
  EXPECT_TRUE(lt::report::emptyPanels(runs).empty());
}

TEST(Plot, KnownSeriesMapsOntoThePlotArea) {
  // Loss falls from 4 (step 10) to 2 (step 50), with a bump to 3 at step 30.
  const auto svg = lt::report::renderSvg({lossOnly("r", {{10, 4.0}, {30, 3.0}, {20, 3.5}, {50, 2.0}})});
  const auto curves = polylines(svg);
  ASSERT_EQ(curves.size(), 1u);
  const auto area = plotAreas(svg).at("loss");
  const auto& pts = curves[0].points;
  ASSERT_EQ(pts.size(), 4u);
  const double tol = 0.06;  // coordinates are written to 0.1 px
  EXPECT_NEAR(pts[0].first, area.x, tol);            // first step: left edge
  EXPECT_NEAR(pts[0].second, area.y, tol);           // max loss: top
  EXPECT_NEAR(pts[3].first, area.x + area.w, tol);   // last step: right edge
  EXPECT_NEAR(pts[3].second, area.y + area.h, tol);  // min loss: bottom
  EXPECT_NEAR(pts[1].first, area.x + area.w / 4, tol);  // step 20 of 10..50, sorted into place
  EXPECT_NEAR(pts[1].second, area.y + area.h / 4, tol);  // loss 3.5 of 2..4
  EXPECT_NEAR(pts[2].second, area.y + area.h / 2, tol);
}

TEST(Plot, LogLossMapsDecadesEvenly) {
  const RunSeries r = lossOnly("r", {{1, 100.0}, {2, 10.0}, {3, 1.0}, {4, -1.0}});
  const auto svg = lt::report::renderSvg({r}, logLossOptions());
  const auto area = plotAreas(svg).at("loss");
  const auto pts = polylines(svg).at(0).points;
  ASSERT_EQ(pts.size(), 3u);  // log scale: the non-positive loss is dropped
  EXPECT_NEAR(pts[0].second, area.y, 0.06);
  EXPECT_NEAR(pts[1].second, area.y + area.h / 2, 0.06);
  EXPECT_NEAR(pts[2].second, area.y + area.h, 0.06);
  EXPECT_NE(svg.find("Loss (log scale)"), std::string::npos);
}

TEST(Plot, SingleStepConstantAndNonFiniteSeriesStayFinite) {
  RunSeries one = lossOnly("single", {{7, 2.5}});
  one.evalLoss = {{7, 2.7}};
  one.peakMib = {{7, 0.0}};
  RunSeries flat = lossOnly("flat", {{1, 3.0}, {2, 3.0}, {3, 3.0}});
  flat.tokensPerS = {{1, 5e4}, {2, 5e4}, {3, 5e4}};
  RunSeries broken = lossOnly("broken", {{1, NAN}, {2, INFINITY}, {3, 1.0}, {4, -INFINITY}, {5, 2.0}});
  const std::vector<std::vector<RunSeries>> cases{{one}, {flat}, {broken}, {one, flat, broken}};
  for (const auto& runs : cases)
    for (bool logLoss : {false, true}) {
      const std::string svg = lt::report::renderSvg(runs, logLossOptions(logLoss));
      EXPECT_FALSE(containsNanOrInf(svg)) << runs.size() << " runs, log " << logLoss;
      EXPECT_TRUE(balancedTags(svg));
    }
  const auto svg = lt::report::renderSvg({broken});
  EXPECT_EQ(polylines(svg).at(0).points.size(), 2u);  // NaN and +-inf are skipped
  const auto single = lt::report::renderSvg({one});
  EXPECT_NE(single.find("<circle"), std::string::npos);  // a one-point curve still shows
  EXPECT_EQ(lt::report::emptyPanels({one}), (std::vector<std::string>{"Throughput", "MFU"}));
  EXPECT_NE(single.find(">no data</text>"), std::string::npos);
}

TEST(Plot, NiceTicksAreOneTwoFiveTimesAPowerOfTen) {
  EXPECT_EQ(lt::report::niceTicks(0, 10, 5), (std::vector<double>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(lt::report::niceTicks(1.93, 4.21, 5), (std::vector<double>{2.0, 2.5, 3.0, 3.5, 4.0}));
  for (auto [lo, hi] : {std::pair{0.0013, 0.0017}, {-3.0, 7.0}, {12345.0, 98765.0}, {0.999, 1.001}}) {
    const auto t = lt::report::niceTicks(lo, hi, 5);
    ASSERT_GE(t.size(), 2u) << lo << " " << hi;
    EXPECT_LE(t.size(), 11u);
    const double step = t[1] - t[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-6 || std::abs(mantissa - 2) < 1e-6 || std::abs(mantissa - 5) < 1e-6)
        << step;
    EXPECT_GE(t.front(), lo - 1e-12);
    EXPECT_LE(t.back(), hi + 1e-12);
  }
  EXPECT_EQ(lt::report::niceTicks(3, 3, 5).size(), 1u);  // no range: no division
}

TEST(Plot, WritePlotReplacesTheFileOrLeavesNothing) {
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/write");
  const std::vector<RunSeries> runs{lossOnly("r", {{1, 2.0}, {2, 1.0}})};
  const auto out = dir / "curves.svg";
  lt::report::writePlot(runs, out.string());
  std::ifstream f(out);
  const std::string svg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(svg, lt::report::renderSvg(runs));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);  // no temporary left
  std::string e = errorOf([&] { lt::report::writePlot(runs, (dir / "curves.pdf").string()); });
  EXPECT_NE(e.find("expected a file ending in .svg or .png"), std::string::npos) << e;
  e = errorOf([&] { lt::report::writePlot(runs, (dir / "no/such/dir/c.svg").string()); });
  EXPECT_NE(e.find("cannot write"), std::string::npos) << e;
  e = errorOf([&] { lt::report::writePlot({}, (dir / "empty.svg").string()); });
  EXPECT_NE(e.find("no runs"), std::string::npos) << e;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
}

TEST(Plot, EqualStemsAreToldApartByTheirDirectory) {
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/stems");
  const auto a = writeText(dir / "run1", "metrics.jsonl", metricsLine(1, 2.0));
  const auto b = writeText(dir / "run2", "metrics.jsonl", metricsLine(1, 2.0));
  const auto runs = lt::report::readRuns({a.string(), b.string()});
  EXPECT_EQ(runs[0].label, "run1/metrics");
  EXPECT_EQ(runs[1].label, "run2/metrics");
  const std::string e = errorOf([&] { lt::report::readRuns({a.string(), b.string()}, {"only one"}); });
  EXPECT_NE(e.find("got 1 labels for 2 metrics files"), std::string::npos) << e;
}

TEST(PlotCli, PlotsTwoRunsToSvgAndPng) {
  const std::string bin = LONGTRAIN_BIN;
  const auto dir = lt::testing::freshTempDir("longtrain_plot_test/cli");
  std::string a, b;
  for (int s = 1; s <= 10; ++s) {
    a += metricsLine(s, 3.0 - 0.1 * s, s == 10 ? 2.1 : -1);
    b += metricsLine(s, 3.5 - 0.1 * s);
  }
  const auto pa = writeText(dir, "a.jsonl", a), pb = writeText(dir, "b.jsonl", b);
  const auto svg = dir / "curves.svg";
  auto r = lt::testing::runCommand(bin + " plot " + pa.string() + " " + pb.string() + " --out " + svg.string() +
                                   " --label base --label 'lr 3e-3'");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("plot: 2 runs, 4 panels -> " + svg.string()), std::string::npos) << r.out;
  std::ifstream f(svg);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find(">lr 3e-3</text>"), std::string::npos);

  r = lt::testing::runCommand(bin + " plot " + pa.string() + " --out " + (dir / "x.svg").string() +
                              " --label a --label b");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("got 2 labels for 1 metrics files"), std::string::npos) << r.out;
  EXPECT_FALSE(fs::exists(dir / "x.svg"));

  if (lt::testing::runCommand("rsvg-convert --version").code != 0) GTEST_SKIP() << "rsvg-convert not installed";
  const auto png = dir / "curves.png";
  r = lt::testing::runCommand(bin + " plot " + pa.string() + " --out " + png.string());
  ASSERT_EQ(r.code, 0) << r.out;
  std::ifstream p(png, std::ios::binary);
  char magic[8] = {};
  p.read(magic, 8);
  EXPECT_EQ(std::string(magic + 1, 3), "PNG");
}

}  // namespace
