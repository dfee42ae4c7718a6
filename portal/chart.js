// Plain SVG charts drawn here (no library). Each chart carries a text alternative: a summary in
// its aria-label and the full numbers in a table under a <details>.
import { h, table, fmtNum } from './ui.js';

const SVG = 'http://www.w3.org/2000/svg';

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, String(v));
  for (const c of children) if (c !== null && c !== undefined) el.append(c instanceof Node ? c : String(c));
  return el;
}

function niceMax(max) {
  if (max <= 5) return 5;
  const mag = 10 ** Math.floor(Math.log10(max));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * mag >= max) return step * mag;
  return 10 * mag;
}

/** Columns over time: points = [{label, count}]. */
// Drawn for the space available, so that labels keep a readable size on phones.
const chartWidth = () => Math.min(720, Math.max(320, (document.getElementById('main')?.clientWidth || 720) - 48));

// Axis text is 12px; a digit or separator of the UI font is at most this wide. Sizing the margins
// from the longest label keeps "10,000,000" whole, where a fixed margin clipped it to "00,000".
const CHAR_PX = 7.5;
const textWidth = (text) => Math.ceil(String(text).length * CHAR_PX);

export function columnChart(title, points, unit = 'observations') {
  const width = chartWidth();
  const height = 240;
  const max = niceMax(Math.max(0, ...points.map((p) => p.count)));
  const ticks = [0, 1, 2, 3, 4].map((i) => (max / 4) * i);
  const pad = { l: Math.max(44, 10 + Math.max(...ticks.map((v) => textWidth(fmtNum(v))))), r: 8, t: 12, b: 40 };
  const innerW = width - pad.l - pad.r;
  const innerH = height - pad.t - pad.b;
  const slot = innerW / Math.max(points.length, 1);
  const total = points.reduce((a, p) => a + p.count, 0);
  const svg = s('svg', {
    viewBox: `0 0 ${width} ${height}`,
    class: 'chart',
    role: 'img',
    'aria-label': `${title}: ${fmtNum(total)} ${unit} over ${points.length} periods`,
    preserveAspectRatio: 'xMidYMid meet',
  });
  for (const v of ticks) {
    const y = pad.t + innerH - (v / max) * innerH;
    svg.append(s('line', { x1: pad.l, x2: width - pad.r, y1: y, y2: y, class: 'grid' }));
    svg.append(s('text', { x: pad.l - 6, y: y + 4, class: 'axis', 'text-anchor': 'end' }, fmtNum(v)));
  }
  const labelEvery = Math.ceil(points.length / Math.max(2, Math.floor(width / 90)));
  points.forEach((p, i) => {
    const barH = (p.count / max) * innerH;
    const x = pad.l + i * slot + slot * 0.15;
    const bar = s('rect', {
      x,
      y: pad.t + innerH - barH,
      width: Math.max(slot * 0.7, 1),
      height: Math.max(barH, p.count ? 1 : 0),
      class: 'bar',
    });
    bar.append(s('title', {}, `${p.label}: ${fmtNum(p.count)}`));
    svg.append(bar);
    if (i % labelEvery === 0) {
      // Centred under its column, but never past either edge.
      const half = textWidth(p.label) / 2;
      const cx = Math.min(Math.max(x + slot * 0.35, half), width - half);
      svg.append(s('text', { x: cx, y: height - pad.b + 16, class: 'axis', 'text-anchor': 'middle' }, p.label));
    }
  });
  return figure(title, svg, points, 'Period');
}

/** Horizontal bars, one per category: items = [{label, count}]. */
export function barChart(title, items) {
  const row = 28;
  const width = chartWidth();
  const labelW = Math.round(width * 0.3);
  const height = Math.max(items.length, 1) * row + 8;
  const max = Math.max(1, ...items.map((p) => p.count));
  // Room right of the longest bar for its count.
  const countW = 6 + Math.max(...items.map((p) => textWidth(fmtNum(p.count))), 0) + 4;
  const svg = s('svg', {
    viewBox: `0 0 ${width} ${height}`,
    class: 'chart',
    role: 'img',
    'aria-label': `${title}: ${items.map((p) => `${p.label} ${p.count}`).join(', ') || 'no data'}`,
  });
  items.forEach((p, i) => {
    const y = 4 + i * row;
    const w = ((width - labelW - countW) * p.count) / max;
    const fits = Math.floor((labelW - 8) / CHAR_PX);
    const label = p.label.length > fits ? `${p.label.slice(0, fits - 1)}…` : p.label;
    svg.append(s('text', { x: labelW - 8, y: y + 18, class: 'axis', 'text-anchor': 'end' }, label));
    const bar = s('rect', { x: labelW, y: y + 4, width: Math.max(w, 1), height: row - 10, class: `bar c${i % 6}` });
    bar.append(s('title', {}, `${p.label}: ${fmtNum(p.count)}`));
    svg.append(bar);
    svg.append(s('text', { x: labelW + w + 6, y: y + 18, class: 'axis' }, fmtNum(p.count)));
  });
  return figure(title, svg, items, 'Form type');
}

function figure(title, svg, points, keyLabel) {
  return h(
    'figure',
    { class: 'figure' },
    h('figcaption', {}, title),
    svg,
    h(
      'details',
      {},
      h('summary', {}, 'Show the numbers'),
      table(title, [
        { label: keyLabel, cell: (p) => p.label },
        { label: 'Count', cell: (p) => fmtNum(p.count), class: 'num' },
      ], points),
    ),
  );
}
