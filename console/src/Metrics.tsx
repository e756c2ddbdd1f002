import { useEffect, useRef, useState } from "react";
import { Api, describeError } from "./api";
import { SERIES, Sample, parseMetrics } from "./prom";

const POINTS = 60;

/** Polls GET /metrics every second and draws each series as an SVG sparkline. */
export function MetricsView({ api }: { api: Api }) {
  const [data, setData] = useState<Record<string, (number | null)[]>>({});
  const [error, setError] = useState<string | null>(null);
  const prev = useRef<Sample | null>(null);
  useEffect(() => {
    let stop = false;
    let timer = 0;
    const tick = async () => {
      try {
        const cur = parseMetrics(await api.metrics(), performance.now());
        if (stop) return;
        const p = prev.current;
        prev.current = cur;
        setData((d) => {
          const next: Record<string, (number | null)[]> = {};
          for (const s of SERIES) next[s.id] = [...(d[s.id] ?? []), s.point(p, cur)].slice(-POINTS);
          return next;
        });
        setError(null);
      } catch (e) {
        if (!stop) setError(describeError(e));
      }
      if (!stop) timer = window.setTimeout(tick, 1000);
    };
    void tick();
    return () => {
      stop = true;
      clearTimeout(timer);
    };
  }, [api]);
  return (
    <div>
      {error && <div className="error">{error}</div>}
      <div className="charts">
        {SERIES.map((s) => {
          const pts = data[s.id] ?? [];
          const last = [...pts].reverse().find((v) => v !== null) ?? null;
          return (
            <div className="chart" key={s.id} data-series={s.id}>
              <div className="chart-head">
                <span>{s.label}</span>
                <b>
                  {last === null ? "—" : fmt(last)} <span className="muted">{s.unit}</span>
                </b>
              </div>
              <Sparkline points={pts} />
            </div>
          );
        })}
      </div>
      <p className="muted">Sampled every second from /metrics; the last {POINTS} seconds.</p>
    </div>
  );
}

function fmt(v: number): string {
  if (Number.isInteger(v)) return String(v);
  if (Math.abs(v) >= 100) return v.toFixed(0);
  if (Math.abs(v) >= 1) return v.toFixed(1);
  return v.toPrecision(2);
}

function Sparkline({ points }: { points: (number | null)[] }) {
  const W = 240;
  const H = 48;
  const vals = points.filter((v): v is number => v !== null);
  const max = Math.max(1e-9, ...vals);
  const step = W / (POINTS - 1);
  const off = POINTS - points.length;
  const coords = points
    .map((v, i) => (v === null ? null : `${((off + i) * step).toFixed(1)},${(H - 2 - (v / max) * (H - 4)).toFixed(1)}`))
    .filter((c): c is string => c !== null);
  return (
    <svg width="100%" height={H} viewBox={`0 0 ${W} ${H}`} preserveAspectRatio="none" className="spark" role="img">
      <line x1={0} y1={H - 1} x2={W} y2={H - 1} className="axis" vectorEffect="non-scaling-stroke" />
      {coords.length > 1 && <polyline points={coords.join(" ")} className="line" vectorEffect="non-scaling-stroke" />}
      {coords.length > 0 && <polygon points={`${coords[0].split(",")[0]},${H - 1} ${coords.join(" ")} ${coords[coords.length - 1].split(",")[0]},${H - 1}`} className="area" />}
    </svg>
  );
}
