// The page's session: which server and which client token.
//
// `?token=…` in the URL is taken once, kept in the tab's sessionStorage and removed from the
// address bar (so it does not stay in the history); `?server=…` points the page at a server
// other than the one serving it (e.g. while developing the page with another web server).

const TOKEN_KEY = "sluice-chat-token";

export interface Session {
  url: string;
  token: string | null;
  /** The token's `sub` claim (who we are), or null when there is no readable client token. */
  sub: string | null;
}

export function loadSession(): Session {
  const params = new URLSearchParams(location.search);
  const fromUrl = params.get("token");
  if (fromUrl) {
    sessionStorage.setItem(TOKEN_KEY, fromUrl);
    params.delete("token");
    const query = params.toString();
    history.replaceState(null, "", location.pathname + (query ? `?${query}` : "") + location.hash);
  }
  const token = sessionStorage.getItem(TOKEN_KEY);
  const url = params.get("server") ?? location.origin;
  return { url, token, sub: token ? subOf(token) : null };
}

export function saveToken(token: string): void {
  sessionStorage.setItem(TOKEN_KEY, token.trim());
}

export function forgetToken(): void {
  sessionStorage.removeItem(TOKEN_KEY);
}

/** The `sub` claim of a JWT, read without verifying it (the server verifies; this only labels the page). */
export function subOf(token: string): string | null {
  const parts = token.split(".");
  if (parts.length !== 3) return null;
  try {
    const base64 = parts[1].replace(/-/g, "+").replace(/_/g, "/");
    const json = decodeURIComponent(
      Array.from(atob(base64), (c) => "%" + c.charCodeAt(0).toString(16).padStart(2, "0")).join(""),
    );
    const claims: unknown = JSON.parse(json);
    if (claims && typeof claims === "object" && typeof (claims as { sub?: unknown }).sub === "string") {
      return (claims as { sub: string }).sub;
    }
    return null;
  } catch {
    return null;
  }
}
