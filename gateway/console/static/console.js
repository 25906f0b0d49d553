// The usage page's charts: the figures come from the page itself (#chart-data), so the
// chart and the table under it show the same numbers. plotly.min.js is the gateway's copy
// of the one in plotly's wheel.
"use strict";

function drawUsage() {
  const source = document.getElementById("chart-data");
  if (!source || typeof Plotly === "undefined") {
    return;
  }
  const chart = JSON.parse(source.textContent);
  const layout = (title, axis) => ({
    title: { text: title },
    barmode: "stack",
    xaxis: { type: "category", title: { text: "Day (UTC)" } },
    yaxis: { title: { text: axis } },
    margin: { t: 48, r: 16, b: 64, l: 72 },
    height: 320,
  });
  const traces = (field) =>
    Object.entries(chart.series).map(([name, series]) => ({
      type: "bar",
      name: name,
      x: chart.days,
      y: series[field],
    }));
  const config = { displaylogo: false, responsive: true };
  Plotly.newPlot("cost-chart", traces("cost_usd"), layout("Cost at list price", "USD"), config);
  Plotly.newPlot("tokens-chart", traces("tokens"), layout("Tokens", "tokens"), config);
}

document.addEventListener("DOMContentLoaded", drawUsage);
