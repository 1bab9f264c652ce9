CUSTOMERS = [
    (1, "ann@example.com", "Ann Lee"), (2, "bo@example.com", "Bo Diaz"), (3, " Ann@Example.com", "Ann L."),
    (4, "cy@example.org", "Cy Tan"), (5, "dee@example.net", "Dee Roy"), (6, "BO@example.com ", "Bo D."),
    (7, "eli@example.com", "Eli Fox"), (8, "ann@example.COM", "A. Lee"), (9, "fay@example.org", "Fay Ng"),
    (10, "Dee@Example.net", "Dee R."), (11, "gus@example.com", "Gus Hart"), (12, "  cy@EXAMPLE.org", "Cy T."),
]
ORDERS = [(i, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 3, 6, 8, 1, 12, 10, 5, 2, 9, 7, 3, 11, 4, 6, 8, 12, 1, 10][i - 1],
           (i * 1733) % 9000 + 500) for i in range(1, 31)]
