import { createRoot } from "react-dom/client";
import { connect } from "sluice-client";
import { SluiceProvider } from "sluice-client/react";
import { App, SignIn } from "./App";
import { loadSession } from "./session";

const session = loadSession();
const root = createRoot(document.getElementById("root")!);

if (session.token === null) {
  root.render(<SignIn />);
} else {
  // The token is a client JWT (never the admin token in a browser): the server reads rooms and
  // messages through the row policies as `auth.sub`, and checks every `send` and append.
  const db = connect({ url: session.url, token: session.token });
  root.render(
    <SluiceProvider client={db}>
      <App client={db} me={session.sub} />
    </SluiceProvider>,
  );
}
