// Placeholder: the console's build (console/) replaces this file.
document.getElementById("app")?.setAttribute("data-loaded", "true");
