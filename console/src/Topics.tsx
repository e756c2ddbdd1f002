import { useEffect, useState } from "react";
import { Api, TopicInfo, describeError } from "./api";
import type { Client } from "sluice-client";
import { TopicTail } from "./live";

export function TopicsView({ api, client }: { api: Api; client: Client }) {
  const [topics, setTopics] = useState<TopicInfo[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [sel, setSel] = useState<string | null>(null);
  const load = () =>
    api
      .topics()
      .then((r) => {
        setTopics(r.topics);
        setSel((s) => s ?? r.topics[0]?.name ?? null);
      })
      .catch((e) => setError(describeError(e)));
  useEffect(() => {
    void load();
  }, [api]);
  const topic = topics?.find((t) => t.name === sel);
  return (
    <div className="split">
      <aside>
        <div className="aside-head">
          <b>Topics</b>
          <button className="link" onClick={() => void load()} title="reload the list">
            ↻
          </button>
        </div>
        {error && <div className="error">{error}</div>}
        {topics?.length === 0 && <div className="muted">No topics (PUT /v1/topics/NAME creates one).</div>}
        <ul className="list">
          {topics?.map((t) => (
            <li key={t.name}>
              <button className={t.name === sel ? "item active" : "item"} onClick={() => setSel(t.name)}>
                {t.name} <span className="muted">{t.records} rec</span>
              </button>
            </li>
          ))}
        </ul>
      </aside>
      <section className="grow">{topic && <Tail key={topic.name} client={client} topic={topic} />}</section>
    </div>
  );
}

const KEEP = 500;

function Tail({ client, topic }: { client: Client; topic: TopicInfo }) {
  const [tagsText, setTagsText] = useState("");
  const [fromOldest, setFromOldest] = useState(false);
  const [tail, setTail] = useState<TopicTail | null>(null);
  const [, setTick] = useState(0);
  useEffect(() => {
    if (!tail) return;
    const off = tail.subscribe(() => setTick((t) => t + 1));
    return () => {
      off();
      tail.close();
    };
  }, [tail]);
  const start = () => {
    const tags = tagsText.split(/[\s,]+/).filter(Boolean);
    setTail(client.watch(topic.name, { tags, keep: KEEP, ...(fromOldest ? { from: topic.first } : {}) }));
  };
  return (
    <div>
      <h3>{topic.name}</h3>
      <div className="muted">
        offsets {topic.first}…{topic.last ?? "—"} · {topic.records} records · {topic.bytes} bytes
      </div>
      <form
        className="toolbar"
        onSubmit={(e) => {
          e.preventDefault();
          start();
        }}
      >
        <input
          name="tags"
          placeholder="tag patterns: user:42 room:* (any may match; empty = all)"
          value={tagsText}
          onChange={(e) => setTagsText(e.target.value)}
        />
        <label>
          <input type="checkbox" checked={fromOldest} onChange={(e) => setFromOldest(e.target.checked)} /> from the oldest kept
        </label>
        <button type="submit" className="primary">
          {tail ? "Restart tail" : "Tail"}
        </button>
        {tail && (
          <button type="button" onClick={() => setTail(null)}>
            Stop
          </button>
        )}
      </form>
      {tail && (
        <div className="results">
          <div className={`status live-status ${tail.status}`}>
            <span className="dot" /> {tail.status} · next offset {tail.next} · showing {tail.records.length} (newest first)
            {tail.error && ` · ${describeError(tail.error)}`}
          </div>
          <table className="grid rows">
            <thead>
              <tr>
                <th>offset</th>
                <th>time</th>
                <th>tags</th>
                <th>data</th>
              </tr>
            </thead>
            <tbody>
              {[...tail.records].reverse().map((r) => (
                <tr key={r.offset}>
                  <td>{r.offset}</td>
                  <td>{new Date(r.ts / 1000).toISOString()}</td>
                  <td>{r.tags.join(" ")}</td>
                  <td>
                    <code>{JSON.stringify(r.data)}</code>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}
