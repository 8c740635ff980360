"""The dashboard's pages, one script each; ``app.py`` runs them through ``st.navigation``."""
